"""Tiny random HF model folders (weights + real fast tokenizer + generation config) for CPU tests.

``make_tiny_model_dir(root, "qwen2")`` saves a transformers model with random float32 weights via
``save_pretrained`` and caches it under ``root`` per (arch, seed, overrides).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

VOCAB_SIZE = 512  # model vocab; the tokenizer uses fewer ids
TOKENIZER_VOCAB = 400
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2
CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello, world! How are you doing today?",
    "Large language models generate text one token at a time.",
    "Paged attention stores keys and values in fixed-size blocks.",
    "我们今天去公园散步，天气很好。",
    "你好，世界！机器学习很有趣。",
    "Emoji test: 😀 🚀 🎉 👍 ❤️",
    "Numbers 0123456789 and symbols #$%&*()[]{}",
    "Once upon a time, there was a little engine that could.",
]


def _base_config(arch: str) -> dict[str, Any]:
    common = dict(
        vocab_size=VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        initializer_range=0.2,  # peaked logits: greedy argmax is not decided by rounding noise
        bos_token_id=0,
        eos_token_id=0,
    )
    if arch == "qwen2":
        return dict(common, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, tie_word_embeddings=True)
    if arch == "llama":
        return dict(common, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, tie_word_embeddings=False)
    if arch == "qwen3":
        # head_dim 32 != hidden/heads (16) exercises the explicit head_dim path.
        return dict(
            common, head_dim=32, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, tie_word_embeddings=True
        )
    raise ValueError(f"unknown tiny arch {arch!r}")


def _hf_classes(arch: str):
    import transformers as tf

    return {
        "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM),
        "llama": (tf.LlamaConfig, tf.LlamaForCausalLM),
        "qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM),
    }[arch]


def _save_tokenizer(folder: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    assert tok.get_vocab_size() <= VOCAB_SIZE
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
    )
    fast.chat_template = CHATML_TEMPLATE
    fast.save_pretrained(str(folder))


def _build(folder: Path, arch: str, seed: int, overrides: dict[str, Any]) -> None:
    config_cls, model_cls = _hf_classes(arch)
    cfg = config_cls(**{**_base_config(arch), **overrides})
    torch.manual_seed(seed)
    model = model_cls(cfg).to(torch.float32).eval()
    with torch.no_grad():
        # HF zero-inits biases and one-inits norms; randomise them so those load paths are tested.
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.normal_(0.0, 0.2)
            elif name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
    model.save_pretrained(str(folder))
    _save_tokenizer(folder)
    (folder / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 0, "eos_token_id": [2, 0], "do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20})
    )


def make_tiny_model_dir(root: Path, arch: str = "qwen2", seed: int = 0, **config_overrides: Any) -> Path:
    """Return a cached HF folder for a tiny random ``arch`` ("qwen2" | "llama" | "qwen3") model.

    ``config_overrides`` go to the transformers config (e.g. ``rope_parameters={...}``,
    ``tie_word_embeddings=False``, ``num_hidden_layers=3``).
    """
    key = json.dumps({"arch": arch, "seed": seed, **config_overrides}, sort_keys=True, default=str)
    digest = hashlib.sha1(key.encode()).hexdigest()[:12]
    folder = Path(root) / f"tiny-{arch}-{seed}-{digest}"
    if (folder / "config.json").is_file():
        return folder
    Path(root).mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=root))
    try:
        _build(tmp, arch, seed, dict(config_overrides))
        try:
            os.rename(tmp, folder)
        except OSError:  # another process built it first
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder
