"""GGUF (llama.cpp) checkpoints: ArchConfig from metadata, HF-named dequantized tensors.

Quantized tensors are dequantized to float32 one at a time with ``gguf.quants.dequantize`` and then
copied into the model dtype by ``load_weights``. llama.cpp's converter permutes the rows of q/k for
the ``llama`` architecture (interleaved rotary pairs); we undo it so our neox-style RoPE applies.
"""

from __future__ import annotations

import functools
import re
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

from aioinfer.layers.rope_config import RopeConfig
from aioinfer.models.arch_config import ArchConfig

# GGUF general.architecture -> (HF architecture, model_type)
_GGUF_ARCHS = {
    "llama": ("LlamaForCausalLM", "llama"),
    "qwen2": ("Qwen2ForCausalLM", "qwen2"),
    "qwen3": ("Qwen3ForCausalLM", "qwen3"),
}

_TOP_LEVEL = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}

_PER_LAYER = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}

_BLOCK_RE = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.(weight|bias)$")

# Tensors llama.cpp stores that our models do not use (precomputed RoPE tables).
_IGNORED = ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight")


def gguf_to_hf_name(name: str) -> str | None:
    """Map a GGUF tensor name to its HF name; None for tensors to skip; KeyError if unknown."""
    if name in _TOP_LEVEL:
        return _TOP_LEVEL[name]
    if name in _IGNORED:
        return None
    m = _BLOCK_RE.match(name)
    if m is None or m.group(2) not in _PER_LAYER:
        raise KeyError(f"unsupported GGUF tensor {name!r}")
    return f"model.layers.{m.group(1)}.{_PER_LAYER[m.group(2)]}.{m.group(3)}"


def _field(reader: Any, key: str, default: Any = None) -> Any:
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


def open_gguf(path: Path) -> Any:
    """Parse a GGUF's metadata and tensor table (a ``gguf.GGUFReader``; the tensor data stays mapped)."""
    return _plain_view_reader_class()(str(path))


@functools.cache
def _plain_view_reader_class() -> type:
    from gguf.gguf_reader import GGUFReader  # the class itself, even while lend_parsed_gguf swaps gguf's name

    class PlainViewReader(GGUFReader):
        """A GGUFReader that slices a plain ndarray view of its memory map.

        The reader cuts one small array out of the file for every part of every metadata value: for
        SmolLM2's 49k tokens and 48k merges ~1.8 million slices, and slicing an ``np.memmap`` runs
        its Python-level ``__getitem__`` / ``__array_finalize__`` each time (~60% of a 6.7 s parse).
        A base-class view of the same mapping slices in C: 2.6 s, the same fields and tensor views
        (still read-only, still backed by the mapping, which the view keeps open).
        """

        @property
        def data(self) -> np.ndarray:
            return self._plain_data

        @data.setter
        def data(self, value: np.ndarray) -> None:  # GGUFReader.__init__ assigns its np.memmap here
            self._plain_data = value.view(np.ndarray)

    return PlainViewReader


# Readers lent to ``gguf.GGUFReader`` calls by ``lend_parsed_gguf``: resolved path -> [reader, users].
_lent: dict[Path, list] = {}
_lent_lock = threading.Lock()
_original_reader: Any = None  # gguf.GGUFReader while a loan is open


@contextmanager
def lend_parsed_gguf(path: Path, reader: Any) -> Iterator[None]:
    """While open, ``gguf.GGUFReader(path)`` (mode "r") returns ``reader`` instead of parsing ``path`` again.

    For transformers' GGUF tokenizer loading, which parses the whole file with ``gguf.GGUFReader``
    just to learn the model type (``load_gguf_checkpoint``): with SmolLM2 that was ~5 s of a ~7 s
    tokenizer load, for metadata this load has already parsed. transformers offers no way to hand
    it a parsed file, so ``gguf.GGUFReader`` itself is swapped (transformers imports it at call
    time) for the block's duration, for this one path only; any other file, and any code that
    kept the class from before, parse as usual. The reader is read-only (a read-only memory map),
    so sharing it is safe. Loans from several threads nest; the last one out restores the class.
    """
    import gguf

    global _original_reader
    key = Path(path).resolve()
    with _lent_lock:
        if not _lent:
            _original_reader = gguf.GGUFReader
            gguf.GGUFReader = _reader_or_loan
        _lent.setdefault(key, [reader, 0])[1] += 1
    try:
        yield
    finally:
        with _lent_lock:
            entry = _lent[key]
            entry[1] -= 1
            if entry[1] == 0:
                del _lent[key]
            if not _lent:
                gguf.GGUFReader = _original_reader
                _original_reader = None


def _reader_or_loan(path: Any, mode: str = "r") -> Any:
    from gguf.gguf_reader import GGUFReader  # the class itself: a caller may keep this function after the loan

    with _lent_lock:
        entry = _lent.get(Path(path).resolve()) if mode == "r" else None
    if entry is not None:
        return entry[0]
    return GGUFReader(path, mode)


def arch_config_from_gguf(reader: Any) -> ArchConfig:
    """Build ArchConfig from GGUF metadata (``{arch}.embedding_length`` etc.)."""
    arch = _field(reader, "general.architecture")
    if arch not in _GGUF_ARCHS:
        raise ValueError(f"unsupported GGUF architecture {arch!r}; supported: {', '.join(_GGUF_ARCHS)}")
    architecture, model_type = _GGUF_ARCHS[arch]

    def get(key: str, default: Any = None) -> Any:
        return _field(reader, f"{arch}.{key}", default)

    hidden = int(get("embedding_length"))
    num_heads = int(get("attention.head_count"))
    num_kv_heads = int(get("attention.head_count_kv", num_heads))
    head_dim = int(get("attention.key_length", hidden // num_heads))
    tensor_names = {t.name for t in reader.tensors}
    # The embedding's row count is what the weights need (GGUF dims are reversed: [hidden, vocab]);
    # metadata and the token list are fallbacks only.
    embd = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
    vocab = int(embd.shape[-1]) if embd is not None else get("vocab_size")
    if vocab is None:
        tokens = _field(reader, "tokenizer.ggml.tokens")
        vocab = len(tokens) if tokens is not None else None
    if vocab is None:
        raise ValueError("GGUF file has no token_embd.weight and no vocabulary size")
    max_pos = int(get("context_length", 2048))

    rope_params: dict[str, Any] = {}
    scaling = get("rope.scaling.type")
    if scaling in ("linear", "yarn"):
        rope_params = {"rope_type": scaling, "factor": float(get("rope.scaling.factor", 1.0))}
        orig = get("rope.scaling.original_context_length")
        if orig is not None:
            rope_params["original_max_position_embeddings"] = int(orig)
    elif scaling not in (None, "none"):
        raise ValueError(f"unsupported GGUF rope scaling {scaling!r}")
    if "rope_freqs.weight" in tensor_names:
        # llama3-style scaling baked into a frequency table; we would need its source parameters.
        raise ValueError("GGUF with a rope_freqs table (llama3 rope scaling) is not supported yet")
    rope = RopeConfig.from_dict(rope_params, float(get("rope.freq_base", 10000.0)), max_pos)

    eos = _field(reader, "tokenizer.ggml.eos_token_id")
    has_bias = "blk.0.attn_q.bias" in tensor_names
    return ArchConfig(
        architecture=architecture,
        model_type=model_type,
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(get("feed_forward_length")),
        num_layers=int(get("block_count")),
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-6)),
        max_position_embeddings=max_pos,
        rope=rope,
        tie_word_embeddings="output.weight" not in tensor_names,
        qkv_bias=has_bias or model_type == "qwen2",
        o_bias="blk.0.attn_output.bias" in tensor_names,
        mlp_bias="blk.0.ffn_up.bias" in tensor_names,
        qk_norm="blk.0.attn_q_norm.weight" in tensor_names,
        bos_token_id=_field(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_ids=(int(eos),) if eos is not None else (),
        dtype=None,
    )


def _unpermute_rows(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Undo llama.cpp's q/k permutation: per head, rows were reordered from [half1 | half2] to
    interleaved pairs; put them back. w: [n_head * head_dim, ...] (weight or bias)."""
    half = w.shape[0] // n_head // 2
    return w.reshape(n_head, half, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def iterate_gguf(reader: Any, cfg: ArchConfig) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (HF name, float32 CPU tensor) for each GGUF tensor, dequantized one at a time."""
    from gguf.quants import dequantize

    permute = cfg.model_type == "llama"
    for t in reader.tensors:
        hf_name = gguf_to_hf_name(t.name)
        if hf_name is None:
            continue
        # GGUF lists dims fastest-first; torch wants them reversed ([out, in] for a matrix).
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        arr = np.ascontiguousarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        if not arr.flags.writeable:  # unquantized tensors come back as read-only memmap views
            arr = arr.copy()
        tensor = torch.from_numpy(arr).reshape(shape)
        if permute and ".q_proj." in hf_name:
            tensor = _unpermute_rows(tensor, cfg.num_heads)
        elif permute and ".k_proj." in hf_name:
            tensor = _unpermute_rows(tensor, cfg.num_kv_heads)
        yield hf_name, tensor
