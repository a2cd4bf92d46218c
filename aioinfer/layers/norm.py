"""RMSNorm computed in float32 exactly as HF does, with a fused residual-add variant.

On CUDA (and only there) the layer runs one Triton kernel per call instead of 8-9 elementwise torch
kernels (aioinfer/layers/triton_ops/rms_norm.py); the CPU path is the pure-torch code (torch_ops.py).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from aioinfer.layers.torch_ops import rms_norm_torch
from aioinfer.layers.triton_ops import fused_ops  # imports no triton; fused_ops() does, on first CUDA call


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm_torch(x, self.weight, self.eps)

    def forward(
        self, x: torch.Tensor, residual: Optional[torch.Tensor] = None, reduce_group=None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """``norm(x)``; with ``residual``: ``s = x + residual`` then ``(norm(s), s)``.

        The add happens in the activation dtype, as HF's decoder layer does (``residual + hidden``).
        ``reduce_group``: x is a row-parallel layer's partial sum; the group sums it over the ranks in
        the same kernel as the add and the norm (TPGroup.all_reduce_add_rms_norm).
        """
        if reduce_group is not None:
            return reduce_group.all_reduce_add_rms_norm(x, residual, self.weight, self.eps)
        # --- CUDA fast path: one fused Triton kernel (same numerics; see triton_ops/rms_norm.py).
        if x.is_cuda and x.dtype == self.weight.dtype and x.dim() in (2, 3):
            ops = fused_ops()
            if ops is not None:
                if residual is None:
                    return ops.rms_norm(x, self.weight, self.eps)
                if x.dim() == 2 and residual.dtype == x.dtype:
                    return ops.fused_add_rms_norm(x, residual, self.weight, self.eps)
        # --- Pure-torch path (CPU, and CUDA without triton).
        if residual is None:
            return self._norm(x)
        s = x + residual
        return self._norm(s), s
