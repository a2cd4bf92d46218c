"""Sliding-window models are refused, not run with full attention past their window (issue 56).

The kernels and the KV manager attend over the whole context, so a checkpoint whose layers look back
only ``sliding_window`` tokens would give wrong outputs once a sequence outgrows the window. The
window is read with transformers' semantics (its config classes are the oracle here: Mistral slides
on every layer, Qwen2/Qwen3 only with ``use_sliding_window`` and above ``max_window_layers``), and
the refusal binds only when the context the engine would run is longer than the window.
"""

from __future__ import annotations

import json

import pytest
import torch

from aioinfer.models.arch_config import ArchConfig, check_attention_window
from aioinfer.models.loader import load_model

# config.json of mistralai/Mistral-7B-v0.1 and Qwen/Qwen2.5-0.5B-Instruct, as published.
MISTRAL_V01 = {
    "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
    "hidden_size": 4096, "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
    "rope_theta": 10000.0, "sliding_window": 4096, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "vocab_size": 32000,
}
QWEN25_05B = {
    "architectures": ["Qwen2ForCausalLM"], "bos_token_id": 151643, "eos_token_id": 151645, "hidden_act": "silu",
    "hidden_size": 896, "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 21,
    "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": True,
    "torch_dtype": "bfloat16", "use_sliding_window": False, "vocab_size": 151936,
}


def _transformers_window(d: dict) -> tuple:
    """(window, sliding layer indices) as transformers' own config class reads ``d``."""
    import transformers as tf

    cls = {"mistral": tf.MistralConfig, "qwen2": tf.Qwen2Config, "qwen3": tf.Qwen3Config, "llama": tf.LlamaConfig}
    cfg = cls[d["model_type"]](**{k: v for k, v in d.items() if k != "model_type"})
    # LlamaConfig keeps a stray key as an attribute, but modeling_llama never reads it.
    window = None if d["model_type"] == "llama" else getattr(cfg, "sliding_window", None)
    if window is None:
        return None, ()
    types = getattr(cfg, "layer_types", None)
    if types is None:  # Mistral: the window applies to every layer
        return window, tuple(range(cfg.num_hidden_layers))
    layers = tuple(i for i, t in enumerate(types) if t == "sliding_attention")
    return (window, layers) if layers else (None, ())


def _without(d: dict, key: str) -> dict:
    return {k: v for k, v in d.items() if k != key}


CASES = {
    "mistral-v0.1": MISTRAL_V01,
    "mistral-v0.2 (window null)": dict(MISTRAL_V01, sliding_window=None),
    "mistral without the key (MistralConfig's 4096)": _without(MISTRAL_V01, "sliding_window"),
    "qwen2.5 as released (use_sliding_window false)": QWEN25_05B,
    "qwen2 use_sliding_window above max_window_layers": dict(QWEN25_05B, use_sliding_window=True, sliding_window=4096),
    "qwen2 use_sliding_window, max_window_layers = all layers": dict(QWEN25_05B, use_sliding_window=True,
                                                                      max_window_layers=24),
    "qwen2 layer_types": dict(QWEN25_05B, use_sliding_window=True, sliding_window=1024,
                              layer_types=["sliding_attention" if i % 2 else "full_attention" for i in range(24)]),
    "qwen3 use_sliding_window without max_window_layers": dict(_without(QWEN25_05B, "max_window_layers"),
                                                               model_type="qwen3", architectures=["Qwen3ForCausalLM"],
                                                               use_sliding_window=True, num_hidden_layers=36),
    "llama with a stray sliding_window": dict(MISTRAL_V01, model_type="llama", architectures=["LlamaForCausalLM"]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_window_is_read_as_transformers_reads_it(name):
    d = CASES[name]
    cfg = ArchConfig.from_hf_dict(d)
    assert (cfg.sliding_window, cfg.sliding_window_layers) == _transformers_window(d)


def test_mistral_v01_is_refused_past_its_window_with_the_way_out():
    cfg = ArchConfig.from_hf_dict(MISTRAL_V01)
    with pytest.raises(ValueError) as err:
        check_attention_window(cfg, cfg.max_position_embeddings)
    msg = str(err.value)
    assert "sliding-window attention" in msg and "every layer of 32" in msg and "last 4096 tokens" in msg
    assert "--max-model-len 4096" in msg and "\n" not in msg
    check_attention_window(cfg, 4096)  # the window hides nothing at 4096 tokens: full attention is exact


def test_qwen2_is_refused_only_where_the_window_is_in_effect():
    check_attention_window(ArchConfig.from_hf_dict(QWEN25_05B), 32768)  # as released: no window
    sliding = ArchConfig.from_hf_dict(dict(QWEN25_05B, use_sliding_window=True, sliding_window=4096))
    with pytest.raises(ValueError, match=r"layers 21\.\.23 of 24 attend to the last 4096 tokens"):
        check_attention_window(sliding, 32768)
    check_attention_window(sliding, 4096)
    # A window no shorter than the context never binds.
    check_attention_window(ArchConfig.from_hf_dict(dict(QWEN25_05B, use_sliding_window=True)), 32768)


def _tiny_mistral(folder, sliding_window=64):
    d = dict(MISTRAL_V01, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=128, max_position_embeddings=512, sliding_window=sliding_window)
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(d))
    return folder


def test_the_loader_refuses_before_reading_weights(tmp_path):
    folder = _tiny_mistral(tmp_path / "mistral")
    # No safetensors in the folder: the refusal must come before any weight is looked for.
    with pytest.raises(ValueError, match="sliding-window attention"):
        load_model(folder, torch.float32, "cpu")
    with pytest.raises(ValueError, match="sliding-window attention"):
        load_model(folder, torch.float32, "cpu", load_format="dummy", max_model_len=65)
    model, cfg = load_model(folder, torch.float32, "cpu", load_format="dummy", max_model_len=64)
    assert cfg.sliding_window == 64 and model is not None
    full = _tiny_mistral(tmp_path / "mistral-v0.2", sliding_window=None)
    load_model(full, torch.float32, "cpu", load_format="dummy")  # v0.2-style: no window, loads


def test_the_offline_engine_reports_the_refusal(tmp_path):
    from aioinfer import LLM

    with pytest.raises(ValueError, match="sliding-window attention"):
        LLM(model=str(_tiny_mistral(tmp_path / "mistral")), load_format="dummy", dtype="float32")
