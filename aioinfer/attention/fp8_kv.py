"""The fp8 KV cache's number format, in torch: what every backend, the cache allocator and the swap
path agree on, so that a block written by one is read right by the others.

The cache holds ``float8_e4m3fn`` (vLLM's ``kv_cache_dtype="fp8"``): 4 exponent bits, 3 mantissa
bits, finite only (largest 448). Each layer has one scale for its keys and one for its values (per
tensor, vLLM's default 1.0, or the checkpoint's calibrated ones: layers/kv_scales.py). A write
stores ``clamp(x * (1 / scale), -448, 448)`` rounded to nearest even; a read gives
``stored.to(dtype) * scale``. The product by the reciprocal (rounded to float32 once) rather than a
division is what the Triton write kernel computes too, so that both store the same bytes.

torch's CPU kernels lack ``index_copy_`` for float8 types; copies of fp8 blocks go through a
``uint8`` view of the same bytes (``raw_bytes``), which is exact and works on every device.
"""

from __future__ import annotations

import struct

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max


def is_fp8(dtype: torch.dtype) -> bool:
    """Whether ``dtype`` is the fp8 KV cache's element type."""
    return dtype == FP8_DTYPE


def inverse_scale(scale: float) -> float:
    """``1 / scale`` rounded to float32: the factor a write multiplies by (ValueError unless scale > 0)."""
    if not (scale > 0 and scale != float("inf")):
        raise ValueError(f"a KV-cache scale must be finite and > 0, got {scale}")
    return struct.unpack("f", struct.pack("f", 1.0 / scale))[0]  # no tensor: this runs per layer and step


def quantize(x: torch.Tensor, scale: float) -> torch.Tensor:
    """``x`` (any float dtype) stored in fp8 with ``scale``: ``clamp(x * (1/scale), ±448)`` rounded."""
    scaled = x.to(torch.float32) * inverse_scale(scale)
    return scaled.clamp_(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def dequantize(x: torch.Tensor, scale: float, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """fp8 ``x`` read back as ``dtype``: ``x.to(dtype) * scale`` (a plain cast for another dtype)."""
    if not is_fp8(x.dtype):
        return x.to(dtype)
    return x.to(dtype) * scale


def raw_bytes(t: torch.Tensor) -> torch.Tensor:
    """``t`` as ``uint8`` when it is fp8 (same bytes, same strides), else ``t``: for index copies."""
    return t.view(torch.uint8) if is_fp8(t.dtype) else t


def zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """A zero-filled tensor of ``dtype``; fp8 ones are made as bytes (0x00 is +0.0 in e4m3fn)."""
    if is_fp8(dtype):
        return torch.zeros(shape, dtype=torch.uint8, device=device).view(dtype)
    return torch.zeros(shape, dtype=dtype, device=device)
