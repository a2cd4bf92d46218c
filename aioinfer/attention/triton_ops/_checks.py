"""Argument checks shared by the Triton wrappers (cheap: shapes, dtypes and strides only, no sync)."""

from __future__ import annotations

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
FP8_DTYPE = torch.float8_e4m3fn  # the fp8 KV cache's (attention/fp8_kv.py); queries stay in FLOAT_DTYPES


def check_kv_cache(key_cache: torch.Tensor, value_cache: torch.Tensor) -> tuple[int, int, int, int]:
    """Both caches [num_blocks, block_size, Hkv, D], same dtype (a float type or fp8), device and
    strides, D contiguous."""
    if key_cache.dim() != 4:
        raise ValueError(f"key_cache must be [num_blocks, block_size, Hkv, D], got {tuple(key_cache.shape)}")
    if key_cache.shape != value_cache.shape:
        raise ValueError("key_cache and value_cache shapes differ")
    if key_cache.dtype != value_cache.dtype:
        raise ValueError("key_cache and value_cache dtypes differ")
    if key_cache.dtype not in (*FLOAT_DTYPES, FP8_DTYPE):
        raise ValueError(f"unsupported cache dtype {key_cache.dtype}")
    if key_cache.stride() != value_cache.stride():
        raise ValueError("key_cache and value_cache strides differ")
    if key_cache.stride(-1) != 1:
        raise ValueError("the head_dim axis of the KV cache must be contiguous")
    num_blocks, block_size, num_kv_heads, head_dim = key_cache.shape
    if not is_pow2(block_size):
        raise ValueError(f"block_size must be a power of two, got {block_size}")
    if not (is_pow2(head_dim) and 16 <= head_dim <= 256):
        raise ValueError(f"head_dim must be a power of two in 16..256, got {head_dim}")
    return num_blocks, block_size, num_kv_heads, head_dim


def check_int_vector(t: torch.Tensor, name: str, dtype: torch.dtype, device: torch.device) -> None:
    if t.dtype != dtype:
        raise ValueError(f"{name} must be {dtype}, got {t.dtype}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device}, expected {device}")
    if not (t.dim() == 1 and (t.numel() <= 1 or t.stride(0) == 1)):
        raise ValueError(f"{name} must be a contiguous vector")


def check_paged_query(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                      block_tables: torch.Tensor, seq_lens: torch.Tensor, num_seqs_hint: str) -> tuple[int, int, int]:
    """Checks shared by the decode and prefill wrappers; returns (block_size, num_kv_heads, head_dim)."""
    _, block_size, num_kv_heads, head_dim = check_kv_cache(key_cache, value_cache)
    if not (query.dim() == 3 and query.shape[2] == head_dim):
        raise ValueError(f"query must be [{num_seqs_hint}, Hq, {head_dim}], got {tuple(query.shape)}")
    if query.shape[1] % num_kv_heads != 0:
        raise ValueError(f"num_heads {query.shape[1]} is not a multiple of num_kv_heads {num_kv_heads}")
    if key_cache.dtype == FP8_DTYPE:
        if query.dtype not in FLOAT_DTYPES:
            raise ValueError(f"query dtype {query.dtype} is not one of {FLOAT_DTYPES} (fp8 cache)")
    elif query.dtype != key_cache.dtype:
        raise ValueError(f"query dtype {query.dtype} != cache dtype {key_cache.dtype}")
    if query.stride(-1) != 1:
        raise ValueError("query head_dim axis must be contiguous")
    if query.device != key_cache.device:
        raise ValueError("query and cache devices differ")
    check_int_vector(seq_lens, "seq_lens", torch.int32, query.device)
    if not (block_tables.dtype == torch.int32 and block_tables.dim() == 2):
        raise ValueError("block_tables must be 2-D int32")
    if not (block_tables.device == query.device and block_tables.stride(1) == 1):
        raise ValueError("block_tables must be row-contiguous on the query device")
    return block_size, num_kv_heads, head_dim


def is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def interpreting() -> bool:
    """True under TRITON_INTERPRET=1 (CPU tests), whose tl.dot mishandles bf16 operands: the
    kernels then upcast dot operands to fp32 (a test-only path; GPU code is unchanged)."""
    import os

    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def check_kv_scales(k_scale: float, v_scale: float) -> None:
    """The per-tensor scales of an fp8 cache: Python numbers, finite and > 0 (a tensor would sync)."""
    for name, value in (("k_scale", k_scale), ("v_scale", v_scale)):
        if not (isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < float("inf")):
            raise ValueError(f"{name} must be a finite Python float > 0, got {value!r}")
