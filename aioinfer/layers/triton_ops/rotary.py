"""Neox-style (HF ``rotate_half``) rotary embedding applied in place to q and k: one launch for both.

Takes the step's cos/sin ([T, rotary_dim], computed once per step and shared by every layer), so the
kernel has no data-dependent shape and no host sync: safe under CUDA-graph capture. q/k may be
strided views of the fused qkv projection output (only the last axis must be contiguous); with
partial rotary (rotary_dim < head_dim) the tail of each head is left untouched.

Numerics replicate the torch path (aioinfer.layers.torch_ops.apply_rotary) rounding for rounding —
``x*cos`` and ``rotate_half(x)*sin`` each rounded to the activation dtype, then their sum rounded —
and fp contraction into FMA is disabled, so outputs are bit-identical in fp32, fp16 and bf16.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from aioinfer.layers.torch_ops import apply_rotary
from aioinfer.layers.triton_ops._checks import check_float, next_pow2


@triton.jit
def _rotate_heads(x_ptr, stride_t, stride_h, t, c1, c2, s1, s2,
                  NUM_HEADS: tl.constexpr, H_PAD: tl.constexpr, HALF: tl.constexpr, HALF_PAD: tl.constexpr):
    h = tl.arange(0, H_PAD)[:, None]
    d = tl.arange(0, HALF_PAD)[None, :]
    mask = (h < NUM_HEADS) & (d < HALF)
    p1 = x_ptr + t * stride_t + h * stride_h + d
    x1 = tl.load(p1, mask=mask, other=0.0)
    x2 = tl.load(p1 + HALF, mask=mask, other=0.0)
    dtype = x1.dtype
    f1 = x1.to(tl.float32)
    f2 = x2.to(tl.float32)
    # out = x * cos + cat(-x2, x1) * sin, with torch's per-op rounding to the activation dtype.
    o1 = ((f1 * c1).to(dtype).to(tl.float32) + (-f2 * s1).to(dtype).to(tl.float32)).to(dtype)
    o2 = ((f2 * c2).to(dtype).to(tl.float32) + (f1 * s2).to(dtype).to(tl.float32)).to(dtype)
    tl.store(p1, o1, mask=mask)
    tl.store(p1 + HALF, o2, mask=mask)


@triton.jit
def _rotary_kernel(
    q_ptr, k_ptr, cos_ptr, sin_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_ct, stride_st,
    HQ: tl.constexpr, HQ_PAD: tl.constexpr, HKV: tl.constexpr, HKV_PAD: tl.constexpr,
    HALF: tl.constexpr, HALF_PAD: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    d = tl.arange(0, HALF_PAD)[None, :]
    dm = d < HALF
    # cos/sin halves loaded separately (equal for HF's cat(freqs, freqs), but no need to assume it).
    c1 = tl.load(cos_ptr + t * stride_ct + d, mask=dm, other=0.0).to(tl.float32)
    c2 = tl.load(cos_ptr + t * stride_ct + HALF + d, mask=dm, other=0.0).to(tl.float32)
    s1 = tl.load(sin_ptr + t * stride_st + d, mask=dm, other=0.0).to(tl.float32)
    s2 = tl.load(sin_ptr + t * stride_st + HALF + d, mask=dm, other=0.0).to(tl.float32)
    _rotate_heads(q_ptr, stride_qt, stride_qh, t, c1, c2, s1, s2, HQ, HQ_PAD, HALF, HALF_PAD)
    _rotate_heads(k_ptr, stride_kt, stride_kh, t, c1, c2, s1, s2, HKV, HKV_PAD, HALF, HALF_PAD)


def _check(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    for name, t in (("k", k), ("cos", cos), ("sin", sin)):
        check_float(t, name, q.dtype, q.device)
    check_float(q, "q", q.dtype, q.device)
    if q.dim() != 3 or k.dim() != 3:
        raise ValueError(f"q/k must be [T, H, D], got {tuple(q.shape)}, {tuple(k.shape)}")
    if k.shape[0] != q.shape[0] or k.shape[2] != q.shape[2]:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} differ in tokens or head_dim")
    if cos.dim() != 2 or sin.shape != cos.shape or cos.shape[0] != q.shape[0]:
        raise ValueError(f"cos/sin must both be [T, rotary_dim], got {tuple(cos.shape)}, {tuple(sin.shape)}")
    rot = cos.shape[1]
    if rot % 2 or not 0 < rot <= q.shape[2]:
        raise ValueError(f"rotary_dim {rot} must be even and in 1..head_dim={q.shape[2]}")


def apply_rotary_inplace(
    q: torch.Tensor,  # [T, Hq, D]
    k: torch.Tensor,  # [T, Hkv, D]
    cos: torch.Tensor,  # [T, rotary_dim], q.dtype
    sin: torch.Tensor,  # [T, rotary_dim], q.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate the first ``rotary_dim`` dims of every q and k head in place (neox / rotate_half);
    returns ``(q, k)``. Grid = T (shape only): no sync, capture-safe. q and k must not overlap."""
    _check(q, k, cos, sin)
    num_tokens = q.shape[0]
    if num_tokens == 0:
        return q, k
    half = cos.shape[1] // 2
    hq, hkv = q.shape[1], k.shape[1]
    _rotary_kernel[(num_tokens,)](
        q, k, cos, sin,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos.stride(0), sin.stride(0),
        HQ=hq, HQ_PAD=next_pow2(hq), HKV=hkv, HKV_PAD=next_pow2(hkv), HALF=half, HALF_PAD=next_pow2(half),
        num_warps=4 if (hq + hkv) * half >= 512 else 1,
        enable_fp_fusion=False,  # no FMA: keeps fp32 bit-identical to the unfused torch mul/add
    )
    return q, k


def apply_rotary_reference(q, k, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
    """The torch path of the layer (aioinfer.layers.torch_ops.apply_rotary), out of place."""
    return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
