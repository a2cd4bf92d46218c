"""FP8 (e4m3) numerics in torch: quantizing weights and activations, and the reference products.

Why a module of its own: the loaders (online quantization of a bf16/fp32 checkpoint), the layers'
forward on any device, and the tests (the dequantized reference every FP8 path is held to) all need
the same three scalings, spelled once:

- per output channel (a row of the weight [N, K]): scale[n] = amax(|W[n, :]|) / 448;
- per 128 x 128 block (HF's ``weight_block_size``): scale[i, j] over W[128i:128i+128, 128j:128j+128];
- per token (a row of the activations [M, K]), computed at run time ("dynamic"), or one static
  scale per tensor read from the checkpoint (``input_scale``).

A scale is the *dequantizing* factor (``x ~= x_fp8 * scale``), as compressed-tensors' ``weight_scale``
and HF's ``weight_scale_inv`` both store it. 448 is e4m3fn's largest finite value; values are clamped
to it before the cast (the cast itself does not saturate).
"""

from __future__ import annotations

from typing import Optional

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
# A zero row (padding, an all-zero projection) would give scale 0 and 0/0 on the way in.
_MIN_SCALE = 1e-12


def to_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``x / scale`` (scale broadcast against x), clamped to e4m3's range, as float8_e4m3fn."""
    return (x.to(torch.float32) / scale).clamp_(-FP8_MAX, FP8_MAX).to(FP8)


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row (output channel of a weight, token of an activation) quantization of x [R, K].

    Returns (x_fp8 [R, K], scale [R, 1] float32)."""
    amax = x.abs().amax(dim=-1, keepdim=True).to(torch.float32)
    scale = (amax / FP8_MAX).clamp_(min=_MIN_SCALE)
    return to_fp8(x, scale), scale


def quantize_tensor(x: torch.Tensor, scale: Optional[torch.Tensor] = None,
                    slots: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One scale for all of x (static activations take the checkpoint's ``scale``). Returns (x_fp8, scale []).

    ``slots`` [rows of x] (a step's KV slot mapping): rows with a negative slot (CUDA-graph padding)
    do not count towards the dynamic scale."""
    if scale is None:
        amax = x.abs().amax(dim=-1) if x.dim() > 1 else x.abs()
        if slots is not None:
            amax = amax.masked_fill(slots < 0, 0)
        scale = (amax.amax().to(torch.float32) / FP8_MAX).clamp_(min=_MIN_SCALE)
    return to_fp8(x, scale), scale.to(torch.float32).reshape(())


def quantize_blocks(w: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-block quantization of w [N, K] with (bn, bk) blocks (the last ones may be partial).

    Returns (w_fp8 [N, K], scale [cdiv(N, bn), cdiv(K, bk)] float32)."""
    bn, bk = block
    n, k = w.shape
    nb, kb = -(-n // bn), -(-k // bk)
    padded = torch.zeros(nb * bn, kb * bk, dtype=torch.float32, device=w.device)
    padded[:n, :k] = w
    tiles = padded.view(nb, bn, kb, bk)
    amax = tiles.abs().amax(dim=(1, 3))  # [nb, kb]
    scale = (amax / FP8_MAX).clamp_(min=_MIN_SCALE)
    q = (tiles / scale[:, None, :, None]).clamp_(-FP8_MAX, FP8_MAX).view(nb * bn, kb * bk)[:n, :k]
    return q.to(FP8), scale


def dequantize_rows(w_fp8: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """w_fp8 [N, K] with per-row scale [N] or [N, 1] -> [N, K] in ``dtype``."""
    return (w_fp8.to(torch.float32) * scale.reshape(-1, 1)).to(dtype)


def dequantize_blocks(w_fp8: torch.Tensor, scale: torch.Tensor, block: tuple[int, int],
                      dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """w_fp8 [N, K] with block scales [cdiv(N, bn), cdiv(K, bk)] -> [N, K] in ``dtype``."""
    bn, bk = block
    n, k = w_fp8.shape
    full = scale.repeat_interleave(bn, dim=0)[:n].repeat_interleave(bk, dim=1)[:, :k]
    return (w_fp8.to(torch.float32) * full).to(dtype)


def requantize_rows(w_fp8: torch.Tensor, row_scale: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """w_fp8 [N, K] with per-row scales [N] as e4m3 under the one ``scale`` [] (>= every row's):
    ``w_fp8 * row_scale / scale``, rounded once (rows already at ``scale`` are unchanged)."""
    ratio = (row_scale.reshape(-1, 1).to(torch.float32) / scale.to(torch.float32))
    return (w_fp8.to(torch.float32) * ratio).clamp_(-FP8_MAX, FP8_MAX).to(FP8)


def scaled_mm_tensor(x_fp8: torch.Tensor, x_scale: torch.Tensor, w_fp8: torch.Tensor, w_scale: torch.Tensor,
                     bias: Optional[torch.Tensor], out_dtype: torch.dtype) -> torch.Tensor:
    """``(x_fp8 * x_scale) @ (w_fp8 * w_scale)^T + bias`` through ``torch._scaled_mm`` with one scale
    per tensor (x_scale, w_scale: float32 []). On CUDA a 16-bit bias rides in the GEMM's epilogue."""
    cuda = x_fp8.is_cuda
    fused_bias = bias if cuda and out_dtype in (torch.bfloat16, torch.float16) else None
    out = torch._scaled_mm(x_fp8, w_fp8.t(), scale_a=x_scale.reshape(()), scale_b=w_scale.reshape(()),
                           bias=fused_bias, out_dtype=out_dtype, use_fast_accum=cuda)
    if bias is not None and fused_bias is None:
        out += bias
    return out


def scaled_mm_rows(x_fp8: torch.Tensor, x_scale: torch.Tensor, w_fp8: torch.Tensor, w_scale: torch.Tensor,
                   bias: Optional[torch.Tensor], out_dtype: torch.dtype) -> torch.Tensor:
    """``(x_fp8 * x_scale) @ (w_fp8 * w_scale)^T + bias`` through ``torch._scaled_mm`` (row-wise scales:
    x_scale [M, 1], w_scale [N] or [N, 1]; both float32). One GEMM on sm_89+ GPUs and on the CPU.

    The row-wise scaled GEMM needs a 16-bit output; float32 (the CPU's exact-test dtype) goes through
    float32 on the CPU, which takes it."""
    out = torch._scaled_mm(x_fp8, w_fp8.t(), scale_a=x_scale.reshape(-1, 1),
                           scale_b=w_scale.reshape(1, -1), out_dtype=out_dtype,
                           use_fast_accum=x_fp8.is_cuda)
    if bias is not None:
        out += bias
    return out
