"""Fused Triton kernels for the per-layer elementwise work (RMSNorm with residual add, rotary, SiLU-and-mul),
the batch-1 linear layers and FP8 activation quantization.

Importing this package does NOT import triton: the kernel modules (``rms_norm``, ``rotary``, ...) do,
and the layers reach them only through :func:`fused_ops`, only for CUDA tensors. CPU paths never
import triton (the design's rule: the CPU path runs without Triton installed).
"""

from __future__ import annotations

import functools
import os
from types import SimpleNamespace
from typing import Optional

DISABLE_ENV = "AIOINFER_DISABLE_FUSED_OPS"  # "1": the layers keep the torch path on CUDA too (A/B runs)


@functools.cache
def fused_ops() -> Optional[SimpleNamespace]:
    """The kernel wrappers, or None when triton does not import or ``AIOINFER_DISABLE_FUSED_OPS=1``.

    Decided once per process (``fused_ops.cache_clear()`` re-decides, for tests).
    """
    if os.environ.get(DISABLE_ENV, "0").lower() in ("1", "true", "on", "yes"):
        return None
    try:
        from aioinfer.layers.triton_ops.fp8_quant import quantize_fp8_rows, quantize_fp8_tensor
        from aioinfer.layers.triton_ops.rms_norm import fused_add_rms_norm, rms_norm
        from aioinfer.layers.triton_ops.rotary import apply_rotary_inplace
        from aioinfer.layers.triton_ops.silu_and_mul import silu_and_mul
        from aioinfer.layers.triton_ops.small_batch_linear import small_batch_linear
    except ImportError:
        return None
    return SimpleNamespace(
        rms_norm=rms_norm, fused_add_rms_norm=fused_add_rms_norm, apply_rotary_inplace=apply_rotary_inplace,
        silu_and_mul=silu_and_mul, small_batch_linear=small_batch_linear, quantize_fp8_rows=quantize_fp8_rows,
        quantize_fp8_tensor=quantize_fp8_tensor,
    )
