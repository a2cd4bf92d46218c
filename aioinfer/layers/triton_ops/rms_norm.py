"""RMSNorm (optionally fused with the residual add) as one Triton kernel: one program per row.

Numerics follow the torch path (aioinfer.layers.torch_ops.rms_norm_torch, HF order) step by step:
  s   = round_dtype(float(x) + float(residual))      # the add in the activation dtype (torch's
                                                       # float opmath then one rounding: bit-exact)
  y   = round_dtype(float(s) * rsqrt(mean(float(s)^2) + eps))
  out = round_dtype(float(weight) * float(y))          # exact product, one rounding: bit-exact
Only the float32 statistic differs (reduction order, rsqrt implementation): ~1e-7 relative, so
fp16/bf16 outputs match bit-for-bit except where y sits on a rounding boundary (<= 2 ulp there),
and fp32 outputs match to ~1e-6 relative. ``new_residual`` is always bit-exact.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from aioinfer.layers.torch_ops import rms_norm_torch
from aioinfer.layers.triton_ops._checks import check_float, next_pow2


@triton.jit
def _rms_norm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr,
    stride_xo, stride_xi,  # row r of x is at (r // INNER) * stride_xo + (r % INNER) * stride_xi
    stride_ro,  # residual: 2-D rows only
    eps,
    N: tl.constexpr, BLOCK: tl.constexpr, INNER: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + (row // INNER) * stride_xo + (row % INNER) * stride_xi + cols, mask=mask, other=0.0)
    dtype = x.dtype
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * stride_ro + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(dtype)  # round to the activation dtype first
        tl.store(res_out_ptr + row * N + cols, x, mask=mask)
    xf = x.to(tl.float32)
    var = tl.sum(xf * xf, axis=0) / N
    y = (xf * tl.math.rsqrt(var + eps)).to(dtype)  # back to the input dtype before the weight (HF)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    out = (w.to(tl.float32) * y.to(tl.float32)).to(dtype)
    tl.store(out_ptr + row * N + cols, out, mask=mask)


def _launch(x: torch.Tensor, residual, weight: torch.Tensor, eps: float):
    check_float(x, "x", x.dtype, x.device)
    check_float(weight, "weight", x.dtype, x.device)
    if x.dim() not in (2, 3):
        raise ValueError(f"x must be [T, N] or [T, H, N], got {tuple(x.shape)}")
    n = x.shape[-1]
    if weight.shape != (n,):
        raise ValueError(f"weight {tuple(weight.shape)} does not match the last dim {n} of x")
    inner = x.shape[1] if x.dim() == 3 else 1
    stride_xi = x.stride(1) if x.dim() == 3 else 0
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)  # contiguous
    res_out = None
    if residual is not None:
        check_float(residual, "residual", x.dtype, x.device)
        if x.dim() != 2 or residual.shape != x.shape:
            raise ValueError(f"x and residual must both be [T, N], got {tuple(x.shape)}, {tuple(residual.shape)}")
        res_out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    rows = x.numel() // n if n else 0
    if rows == 0:
        return out, res_out
    block = next_pow2(n)
    _rms_norm_kernel[(rows,)](
        x, residual if residual is not None else x, weight, out, res_out if res_out is not None else out,
        x.stride(0), stride_xi, residual.stride(0) if residual is not None else 0,
        float(eps),
        N=n, BLOCK=block, INNER=inner, HAS_RESIDUAL=residual is not None,
        num_warps=min(16, max(1, block // 256)),
    )
    return out, res_out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight * rmsnorm(x)`` over the last dim. x: [T, N] or [T, H, N] (e.g. per-head q/k norm on a
    strided view; the last dim contiguous); weight: [N], same dtype. Returns a new contiguous tensor."""
    return _launch(x, None, weight, eps)[0]


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``s = x + residual`` (in x.dtype) -> ``(weight * rmsnorm(s), s)``, one launch. x, residual: [T, N]
    (rows may be strided, the last dim contiguous), weight: [N], all one dtype. Inputs are not modified."""
    out, res_out = _launch(x, residual, weight, eps)
    return out, res_out


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The torch path of the layer (aioinfer.layers.torch_ops.rms_norm_torch), the oracle for :func:`rms_norm`."""
    return rms_norm_torch(x, weight, eps)


def fused_add_rms_norm_reference(x, residual, weight, eps) -> tuple[torch.Tensor, torch.Tensor]:
    """The torch path of the layer, the oracle for :func:`fused_add_rms_norm`."""
    s = x + residual
    return rms_norm_torch(s, weight, eps), s
