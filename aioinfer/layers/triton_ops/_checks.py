"""Argument checks shared by the fused-op wrappers (shapes, dtypes and strides only: no host sync)."""

from __future__ import annotations

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def check_float(t: torch.Tensor, name: str, dtype: torch.dtype, device: torch.device) -> None:
    if t.dtype not in FLOAT_DTYPES:
        raise ValueError(f"{name}: unsupported dtype {t.dtype}")
    if t.dtype != dtype:
        raise ValueError(f"{name} is {t.dtype}, expected {dtype}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device}, expected {device}")
    if t.numel() and t.stride(-1) != 1:
        raise ValueError(f"{name}: the last axis must be contiguous (stride 1), got strides {t.stride()}")


def next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())
