"""Gated activations on the fused gate_up projection."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SiluAndMul(nn.Module):
    """``silu(gate) * up`` where the input is ``[..., 2*I]`` = [gate | up] (gate_up_proj row order)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # [T, 2I] -> [T, I]
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up


def get_act_and_mul(name: str) -> nn.Module:
    if name in ("silu", "swish"):
        return SiluAndMul()
    raise ValueError(f"unsupported hidden_act {name!r} (supported: silu)")
