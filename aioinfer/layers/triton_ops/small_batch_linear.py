"""``y = x @ W^T (+ b)`` for a few rows (decode at batch 1-8) as one Triton kernel.

Why: at batch 1 a decode step is weight reads, and cuBLAS' kernels for these skinny products left
bandwidth unused on the H200: per layer of qwen2.5-7b, 135 us of cuBLAS against 120 us for this
kernel (gate_up 71.7 -> 64.1 us = 4.24 TB/s, down 41.0 -> 36.4, o_proj 11.5 -> 9.1 with no split-K
reduce kernel; benchmarks/probes/gemv_sweep.py, H200, 2026-11-29). Each program streams
BLOCK_N whole weight rows once (no split-K, so no second kernel) in BLOCK_K-wide chunks and keeps
the input row in L1/L2. At 2-8 rows cuBLAS stays ahead except on wide projections (gate_up: 64
against 70 us), so the layers use the kernel for every projection at 1 row and for wide ones
(out >= 4 x in) up to 8 rows.

Tried and dropped: folding the RMSNorm (+ residual add) or SiLU-and-mul in front of the product into
this kernel's input read. Every program then recomputes the prologue over the whole input, and
with the small BLOCK_N that streams best that is as many L2 bytes as weight bytes: 169 us a layer
against 142 for separate kernels (same sweep).

Numerics: float32 accumulation over K in another order than cuBLAS, the bias added in float32, one
rounding to the output dtype; tests/layers/test_small_batch_linear.py states the tolerance.

FP8 weights (e4m3 with a float32 scale per output row, layers/quantization/fp8_linear.py): the same
kernel reads half the bytes, widens each weight exactly, and scales the row's float32 sum once
before the bias; the activations stay 16-bit (weight-only: no activation quantization at decode).
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from aioinfer.layers.triton_ops._checks import check_float, next_pow2

MAX_ROWS = 8  # rows the kernel takes; the layers use it only where it was measured to win (layers/linear.py)


@triton.jit
def _small_batch_linear_kernel(
    x_ptr, w_ptr, b_ptr, s_ptr, out_ptr,
    M, N, K, stride_x, stride_w, stride_o,
    HAS_BIAS: tl.constexpr, HAS_SCALE: tl.constexpr, M_PAD: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, USE_DOT: tl.constexpr,
):
    pid = tl.program_id(0)
    rows = tl.arange(0, M_PAD)
    row_mask = rows < M
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    acc = tl.zeros([M_PAD, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        col_mask = cols < K
        # The weights are read once per step and never again: keep them from evicting the input.
        w = tl.load(w_ptr + offs_n[:, None] * stride_w + cols[None, :], mask=n_mask[:, None] & col_mask[None, :],
                    other=0.0, eviction_policy="evict_first")
        x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=row_mask[:, None] & col_mask[None, :],
                    other=0.0)
        if USE_DOT:  # tensor cores; M_PAD >= 16 rows (the padding rows are zeros)
            acc += tl.dot(x, tl.trans(w.to(x.dtype)), input_precision="ieee" if x.dtype == tl.float32 else "tf32")
        else:  # CUDA cores: a broadcast product (1 row; more rows spill registers)
            acc += tl.sum(x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :], axis=2)
    if HAS_SCALE:
        acc *= tl.load(s_ptr + offs_n, mask=n_mask, other=0.0)[None, :]
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    out_mask = row_mask[:, None] & n_mask[None, :]
    tl.store(out_ptr + rows[:, None] * stride_o + offs_n[None, :], acc.to(out_ptr.dtype.element_ty), mask=out_mask)


def default_config(m: int, n: int, k: int, fp8: bool = False) -> tuple[int, int, int, bool]:
    """(BLOCK_N, BLOCK_K, num_warps, use tensor cores), from H200 sweeps over the 7b projections at
    tensor-parallel sizes 1 and 2 (benchmarks/probes/gemv_sweep.py). One row: CUDA cores, few rows per
    program, long chunks; (4, 2048, 4) was within ~1 us of the best config on every shape. 2-8
    rows: the broadcast product spills, tensor cores on 32-row tiles stream best (gate_up 64 us
    against cuBLAS' 70 at tp 1, 33 against 37 at tp 2).

    FP8 weights at one row (H100 sweep, benchmarks/probes/fp8_gemm_parts.py): chunks of 4096 columns
    (the bytes of a 16-bit 2048) where K <= 8192: qkv 8.2 -> 7.8 us, gate_up 53.3 -> 49.3, o 7.2 ->
    6.6; the down projection (K = 18944) keeps 2048 (29.5 us, the best)."""
    if m == 1:
        return (4, 4096, 4, False) if fp8 and k <= 8192 else (4, 2048, 4, False)
    return (32, 128, 4, True)


def small_batch_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None, *,
                       weight_scale: Optional[torch.Tensor] = None, config: Optional[tuple] = None) -> torch.Tensor:
    """``x @ weight^T + bias`` for x [M <= MAX_ROWS, K] (rows may be strided); weight [N, K] with
    contiguous rows, bias [N] or None, all one dtype. Returns a new [M, N] tensor. ``config``:
    (BLOCK_N, BLOCK_K, num_warps[, use_dot]), for benchmarks; None = :func:`default_config`.
    ``weight_scale`` [N] float32: the weight is e4m3 and row n means ``weight[n] * weight_scale[n]``."""
    check_float(x, "x", x.dtype, x.device)
    if weight_scale is None:
        check_float(weight, "weight", x.dtype, x.device)
    else:
        if weight.dtype != torch.float8_e4m3fn or weight.device != x.device or weight.stride(-1) != 1:
            raise ValueError(f"a scaled weight must be contiguous float8_e4m3fn on {x.device}, got {weight.dtype}")
        if (weight_scale.dtype != torch.float32 or weight_scale.shape != (weight.shape[0],)
                or not weight_scale.is_contiguous()):
            raise ValueError(f"weight_scale must be float32 [{weight.shape[0]}], got {weight_scale.dtype} "
                             f"{tuple(weight_scale.shape)}")
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"x must be [M, K] and weight [N, K], got {tuple(x.shape)}, {tuple(weight.shape)}")
    m = x.shape[0]
    n, k = weight.shape
    if m > MAX_ROWS:
        raise ValueError(f"small_batch_linear takes at most {MAX_ROWS} rows, got {m}")
    if bias is not None:
        check_float(bias, "bias", x.dtype, x.device)
        if bias.shape != (n,):
            raise ValueError(f"bias {tuple(bias.shape)} does not match {n} outputs")
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return out
    block_n, block_k, num_warps, use_dot = (*(config or default_config(m, n, k, weight_scale is not None)), False)[:4]
    m_pad = max(16, next_pow2(m)) if use_dot else next_pow2(m)
    _small_batch_linear_kernel[(triton.cdiv(n, block_n),)](
        x, weight, bias if bias is not None else weight, weight_scale if weight_scale is not None else weight, out,
        m, n, k, x.stride(0), weight.stride(0), out.stride(0),
        HAS_BIAS=bias is not None, HAS_SCALE=weight_scale is not None, M_PAD=m_pad, BLOCK_N=block_n, BLOCK_K=block_k, USE_DOT=use_dot,
        num_warps=num_warps,
    )
    return out
