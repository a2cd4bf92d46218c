"""The pure-torch forms of the ops that layers/triton_ops/ fuses: RMSNorm, rotary, SiLU-and-mul.

Each is the layer's CPU path and the oracle its Triton kernel is tested against. They live here,
not in the layer modules, so that the kernel modules (which import them as references) never
import the layers, which import the kernels (through ``triton_ops.fused_ops``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm_torch(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # [..., H]: statistics in float32, then back to the input dtype *before* the weight multiply (HF order).
    dtype = x.dtype
    xf = x.to(torch.float32)
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first ``cos.shape[-1]`` dims of each head. x: [T, H, D]; cos/sin: [T, Dr] in x.dtype."""
    rot_dim = cos.shape[-1]
    cos = cos.unsqueeze(1)  # [T, 1, Dr]
    sin = sin.unsqueeze(1)
    if rot_dim == x.shape[-1]:
        x_rot, x_pass = x, None
    else:
        x_rot, x_pass = x[..., :rot_dim], x[..., rot_dim:]
    x1, x2 = x_rot[..., : rot_dim // 2], x_rot[..., rot_dim // 2 :]
    out = x_rot * cos + torch.cat((-x2, x1), dim=-1) * sin
    return out if x_pass is None else torch.cat((out, x_pass), dim=-1)


def silu_and_mul_torch(x: torch.Tensor) -> torch.Tensor:
    """The CPU path and the oracle of the fused kernel. [..., 2I] -> [..., I]."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up
