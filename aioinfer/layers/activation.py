"""Gated activations on the fused gate_up projection."""

from __future__ import annotations

import torch
from torch import nn

from aioinfer.layers.torch_ops import silu_and_mul_torch
from aioinfer.layers.triton_ops import fused_ops


class SiluAndMul(nn.Module):
    """``silu(gate) * up`` where the input is ``[..., 2*I]`` = [gate | up] (gate_up_proj row order)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # [T, 2I] -> [T, I]
        if x.is_cuda and x.dim() == 2:
            ops = fused_ops()
            if ops is not None:
                return ops.silu_and_mul(x)
        return silu_and_mul_torch(x)


def get_act_and_mul(name: str) -> nn.Module:
    if name in ("silu", "swish"):
        return SiluAndMul()
    raise ValueError(f"unsupported hidden_act {name!r} (supported: silu)")
