"""``silu(gate) * up`` over the fused gate_up output as one Triton kernel.

The torch path (``F.silu(gate) * up`` on two strided halves) is two non-vectorised elementwise
kernels and an intermediate tensor: on the H200 profile of a 7b prefill step of 8192 tokens they
took 26 ms of 229 ms. One kernel reads gate and up once and writes the output once.

Numerics follow the torch path step by step:
  s   = round_dtype(g / (1 + exp(-g)))       # torch's silu: float opmath, one rounding
  out = round_dtype(float(s) * float(up))    # exact product, one rounding
With CUDA's expf and IEEE division (as torch's kernel uses) the result is expected bit-exact;
the tests allow 1 ulp for a compiler contracting differently.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from aioinfer.layers.triton_ops._checks import check_float

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")  # the CPU interpreter has no libdevice


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, stride_x, stride_o, I, BLOCK: tl.constexpr, LIBDEVICE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < I
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    up = tl.load(x_ptr + row * stride_x + I + cols, mask=mask, other=0.0)
    g = gate.to(tl.float32)
    # libdevice's exp is CUDA's expf and div_rn the IEEE division, as in torch's silu kernel (tl.exp
    # and "/" would be the faster approximate forms, a few ulp away from torch).
    if LIBDEVICE:
        s = tl.math.div_rn(g, 1.0 + libdevice.exp(-g)).to(gate.dtype)
    else:
        s = (g / (1.0 + tl.exp(-g))).to(gate.dtype)
    out = (s.to(tl.float32) * up.to(tl.float32)).to(gate.dtype)
    tl.store(out_ptr + row * stride_o + cols, out, mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x: [T, 2I] (rows may be strided, the last dim contiguous) -> new contiguous [T, I]."""
    check_float(x, "x", x.dtype, x.device)
    if x.dim() != 2 or x.shape[1] % 2:
        raise ValueError(f"x must be [T, 2*I], got {tuple(x.shape)}")
    rows, inter = x.shape[0], x.shape[1] // 2
    out = torch.empty(rows, inter, dtype=x.dtype, device=x.device)
    if rows == 0 or inter == 0:
        return out
    block = 1024
    _silu_and_mul_kernel[(rows, triton.cdiv(inter, block))](
        x, out, x.stride(0), out.stride(0), inter, BLOCK=block, LIBDEVICE=not _INTERPRET, num_warps=4)
    return out


def silu_and_mul_reference(x: torch.Tensor) -> torch.Tensor:
    """The torch path of the layer (aioinfer.layers.torch_ops.silu_and_mul_torch), the oracle for
    :func:`silu_and_mul`."""
    from aioinfer.layers.torch_ops import silu_and_mul_torch

    return silu_and_mul_torch(x)
