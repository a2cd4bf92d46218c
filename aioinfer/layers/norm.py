"""RMSNorm computed in float32 exactly as HF does, with a fused residual-add variant."""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        # [..., H]: statistics in float32, then back to the input dtype *before* the weight multiply (HF order).
        dtype = x.dtype
        xf = x.to(torch.float32)
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(dtype)

    def forward(
        self, x: torch.Tensor, residual: Optional[torch.Tensor] = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """``norm(x)``; with ``residual``: ``s = x + residual`` then ``(norm(s), s)``.

        The add happens in the activation dtype, as HF's decoder layer does (``residual + hidden``).
        """
        if residual is None:
            return self._norm(x)
        s = x + residual
        return self._norm(s), s
