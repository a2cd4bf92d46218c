"""FP8 quantization of activations at run time, per token or per tensor, as Triton kernels.

Why: an FP8 GEMM takes its activations in e4m3 with a scale computed at run time. In torch that is
abs, amax, a division, clamp and the cast: five kernels and two intermediates per linear layer.

- Per token: one program per row reads it twice (its amax, then the scaled cast) and writes the
  e4m3 row and its scale.
- Per tensor (the online format's activations, for cuBLASLt's tensor-wise GEMM): the scale needs the
  amax of the whole tensor before any element is cast, so two kernels: up to ``PARTS`` programs each
  reduce a strided set of rows to one partial amax; then one program per row takes the max of those
  partials (a few hundred floats, from L2), casts its row, and the first also writes the scale. No
  atomics and no zeroed buffer: the result is the same on every run, and CUDA-graph safe.

Numerics are those of aioinfer.layers.quantization.fp8.quantize_rows / quantize_tensor (the
references): scale = max(amax / 448, 1e-12) in float32, q = cast_e4m3(clamp(x / scale, -448, 448));
the division is IEEE, so kernel and reference agree bit for bit.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from aioinfer.layers.triton_ops._checks import check_float

# Triton kernels read module globals only as constexprs.
FP8_MAX = tl.constexpr(448.0)  # e4m3fn's largest finite value
MIN_SCALE = tl.constexpr(1e-12)  # as quantize_rows: an all-zero row gets this scale, not 0


@triton.jit
def _quantize_rows_kernel(x_ptr, q_ptr, scale_ptr, K, stride_x, stride_q, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    amax = tl.zeros([BLOCK], dtype=tl.float32)
    for k0 in range(0, K, BLOCK):
        cols = k0 + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * stride_x + cols, mask=cols < K, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.abs(x))
    scale = tl.maximum(tl.max(amax, 0) / FP8_MAX, MIN_SCALE)
    tl.store(scale_ptr + row, scale)
    for k0 in range(0, K, BLOCK):
        cols = k0 + tl.arange(0, BLOCK)
        mask = cols < K
        x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        q = tl.minimum(tl.maximum(tl.math.div_rn(x, scale), -FP8_MAX), FP8_MAX)
        tl.store(q_ptr + row * stride_q + cols, q.to(q_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _partial_amax_kernel(x_ptr, slot_ptr, part_ptr, M, K, stride_x, PARTS, BLOCK: tl.constexpr,
                         HAS_SLOTS: tl.constexpr):
    part = tl.program_id(0)
    amax = tl.zeros([BLOCK], dtype=tl.float32)
    for row in range(part, M, PARTS):
        real = True
        if HAS_SLOTS:  # a CUDA-graph padding row (slot -1) must not set the scale of the real ones
            real = tl.load(slot_ptr + row) >= 0
        for k0 in range(0, K, BLOCK):
            cols = k0 + tl.arange(0, BLOCK)
            x = tl.load(x_ptr + row.to(tl.int64) * stride_x + cols, mask=(cols < K) & real, other=0.0)
            amax = tl.maximum(amax, tl.abs(x.to(tl.float32)))
    tl.store(part_ptr + part, tl.max(amax, 0))


@triton.jit
def _quantize_tensor_kernel(x_ptr, part_ptr, q_ptr, scale_ptr, K, stride_x, stride_q, PARTS,
                            BLOCK: tl.constexpr, PARTS_PAD: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, PARTS_PAD)
    amax = tl.max(tl.load(part_ptr + offs, mask=offs < PARTS, other=0.0), 0)
    scale = tl.maximum(amax / FP8_MAX, MIN_SCALE)
    if row == 0:
        tl.store(scale_ptr, scale)
    for k0 in range(0, K, BLOCK):
        cols = k0 + tl.arange(0, BLOCK)
        mask = cols < K
        x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        q = tl.minimum(tl.maximum(tl.math.div_rn(x, scale), -FP8_MAX), FP8_MAX)
        tl.store(q_ptr + row * stride_q + cols, q.to(q_ptr.dtype.element_ty), mask=mask)


# Programs of the partial-amax pass: enough to stream a decode batch (one row each up to 256 rows)
# and a prefill chunk (a strided share of rows each) at close to the copy rate.
PARTS = 256


def quantize_fp8_tensor(x: torch.Tensor, slots: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (16- or 32-bit, last dim contiguous) -> (e4m3 [M, K], float32 scale [] for all of x).

    ``slots`` [M] (the step's KV slot mapping): rows whose slot is negative (CUDA-graph padding) are
    cast but left out of the scale, so that a padded replay quantizes the real rows as the eager
    step does."""
    check_float(x, "x", x.dtype, x.device)
    if x.dim() != 2:
        raise ValueError(f"x must be [M, K], got {tuple(x.shape)}")
    if slots is not None and (slots.shape != (x.shape[0],) or slots.device != x.device):
        raise ValueError(f"slots must be [{x.shape[0]}] on {x.device}, got {tuple(slots.shape)} on {slots.device}")
    m, k = x.shape
    q = torch.empty(m, k, dtype=torch.float8_e4m3fn, device=x.device)
    scale = torch.empty((), dtype=torch.float32, device=x.device)
    if m == 0 or k == 0:
        return q, scale.fill_(MIN_SCALE.value)
    parts = min(m, PARTS)
    partial = torch.empty(parts, dtype=torch.float32, device=x.device)
    block = min(4096, triton.next_power_of_2(k))
    warps = 8 if block >= 2048 else 4
    _partial_amax_kernel[(parts,)](x, slots if slots is not None else partial, partial, m, k, x.stride(0), parts,
                                   BLOCK=block, HAS_SLOTS=slots is not None, num_warps=warps)
    _quantize_tensor_kernel[(m,)](x, partial, q, scale, k, x.stride(0), q.stride(0), parts, BLOCK=block,
                                  PARTS_PAD=triton.next_power_of_2(parts), num_warps=warps)
    return q, scale


def quantize_fp8_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (16- or 32-bit, last dim contiguous) -> (e4m3 [M, K], float32 scales [M, 1])."""
    check_float(x, "x", x.dtype, x.device)
    if x.dim() != 2:
        raise ValueError(f"x must be [M, K], got {tuple(x.shape)}")
    m, k = x.shape
    q = torch.empty(m, k, dtype=torch.float8_e4m3fn, device=x.device)
    scale = torch.empty(m, 1, dtype=torch.float32, device=x.device)
    if m == 0 or k == 0:
        return q, scale
    block = min(4096, triton.next_power_of_2(k))
    _quantize_rows_kernel[(m,)](x, q, scale, k, x.stride(0), q.stride(0), BLOCK=block,
                                num_warps=8 if block >= 2048 else 4)
    return q, scale
