"""Write the step's new K/V into the paged cache through the slot mapping (one launch for K and V).

slot = block_id * block_size + offset; slots < 0 are skipped, so padded rows of a CUDA-graph batch
can carry -1 and write nothing.

An fp8 cache (float8_e4m3fn, attention/fp8_kv.py) is written quantized: ``x * (1 / scale)`` in
float32 (the reciprocal rounded to float32 on the host, as the torch backend and the reference do),
clamped to ±448, then converted with round-to-nearest-even, so that every backend stores the same
bytes for the same K/V.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from aioinfer.attention.fp8_kv import inverse_scale, is_fp8, quantize, raw_bytes
from aioinfer.attention.triton_ops._checks import check_kv_cache, check_kv_scales, next_pow2


@triton.jit
def _kv_write_kernel(
    key_ptr, value_ptr,  # [T, Hkv, D]
    k_cache_ptr, v_cache_ptr,  # [num_blocks, block_size, Hkv, D]
    slot_ptr,  # [T] int64
    inv_k_scale, inv_v_scale,  # fp32: 1 / the layer's K and V scales (used when QUANT)
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_cb, stride_cs, stride_ch,
    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, HKV_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    QUANT: tl.constexpr,  # the cache is fp8: scale and clamp before the conversion
):
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t)
    if slot < 0:
        return
    blk = slot // BLOCK_SIZE
    off = slot % BLOCK_SIZE
    h = tl.arange(0, HKV_PAD)[:, None]
    d = tl.arange(0, HEAD_DIM)[None, :]
    mask = h < NUM_KV_HEADS
    t64 = t.to(tl.int64)
    dst = blk * stride_cb + off * stride_cs + h * stride_ch + d
    k = tl.load(key_ptr + t64 * stride_kt + h * stride_kh + d, mask=mask)
    v = tl.load(value_ptr + t64 * stride_vt + h * stride_vh + d, mask=mask)
    if QUANT:  # e4m3fn has no inf: clamp to its largest finite value, as the torch backend does
        k = tl.minimum(tl.maximum(k.to(tl.float32) * inv_k_scale, -448.0), 448.0)
        v = tl.minimum(tl.maximum(v.to(tl.float32) * inv_v_scale, -448.0), 448.0)
    tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def write_kv(
    key: torch.Tensor,  # [T, Hkv, D]
    value: torch.Tensor,  # [T, Hkv, D]
    key_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # [>= T] int64; rows < 0 are skipped
    k_scale: float = 1.0,  # fp8 cache: stored = key / k_scale (ignored for another cache dtype)
    v_scale: float = 1.0,
) -> None:
    """Store key[t]/value[t] at slot_mapping[t] of the caches, in place (quantized for an fp8 cache).
    Grid = T (shape only)."""
    _, block_size, num_kv_heads, head_dim = check_kv_cache(key_cache, value_cache)
    quant = is_fp8(key_cache.dtype)
    if quant:
        check_kv_scales(k_scale, v_scale)
    if key.dtype not in (torch.float16, torch.bfloat16, torch.float32) or value.dtype != key.dtype:
        raise ValueError(f"key/value must share a float dtype, got {key.dtype} and {value.dtype}")
    if not (key.shape == value.shape and key.dim() == 3):
        raise ValueError(f"key/value must be [T, Hkv, D], got {tuple(key.shape)}")
    if not (key.shape[1:] == (num_kv_heads, head_dim)):
        raise ValueError(f"key {tuple(key.shape)} does not match the cache heads/dim")
    if not (key.stride(-1) == 1 and value.stride(-1) == 1):
        raise ValueError("key/value head_dim axis must be contiguous")
    if not (key.device == key_cache.device and value.device == key_cache.device):
        raise ValueError("key/value/cache devices differ")
    if not (slot_mapping.dtype == torch.int64 and slot_mapping.dim() == 1):
        raise ValueError("slot_mapping must be a 1-D int64 tensor")
    if slot_mapping.device != key_cache.device:
        raise ValueError("slot_mapping is on another device")
    if not (slot_mapping.numel() == 0 or slot_mapping.stride(0) == 1):
        raise ValueError("slot_mapping must be contiguous")
    num_tokens = key.shape[0]
    if slot_mapping.numel() < num_tokens:
        raise ValueError("slot_mapping is shorter than key")
    if num_tokens == 0:
        return
    _kv_write_kernel[(num_tokens,)](
        key, value, key_cache, value_cache, slot_mapping,
        inverse_scale(k_scale) if quant else 1.0, inverse_scale(v_scale) if quant else 1.0,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim, HKV_PAD=next_pow2(num_kv_heads), BLOCK_SIZE=block_size,
        QUANT=quant, num_warps=4 if num_kv_heads * head_dim >= 512 else 1,
    )


def write_kv_reference(key, value, key_cache, value_cache, slot_mapping, k_scale: float = 1.0,
                       v_scale: float = 1.0) -> None:
    """Pure-torch reference of :func:`write_kv` (same skip rule for negative slots, same quantization)."""
    num_tokens = key.shape[0]
    slots = slot_mapping[:num_tokens]
    keep = slots >= 0
    num_kv_heads, head_dim = key_cache.shape[-2:]
    if is_fp8(key_cache.dtype):
        key, value = quantize(key, k_scale), quantize(value, v_scale)
    else:
        key, value = key.to(key_cache.dtype), value.to(value_cache.dtype)
    raw_bytes(key_cache).view(-1, num_kv_heads, head_dim)[slots[keep]] = raw_bytes(key[keep])
    raw_bytes(value_cache).view(-1, num_kv_heads, head_dim)[slots[keep]] = raw_bytes(value[keep])
