"""Rotary position embedding, neox style (HF ``rotate_half``), with default/linear/llama3/yarn scaling.

The inverse-frequency formulas follow transformers' ``ROPE_INIT_FUNCTIONS`` operation for operation so
that float32 logits match HF bit-for-bit up to GEMM rounding; tests compare the two directly.
cos/sin are computed per step from the flat ``positions`` (a [T, D] outer product: cheaper than a
max_position-sized cache, and no cache to outgrow).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from aioinfer.layers.torch_ops import apply_rotary
from aioinfer.layers.triton_ops import fused_ops  # imports no triton; fused_ops() does, on first CUDA call
from aioinfer.layers.rope_config import RopeConfig


def compute_inv_freq(rope: RopeConfig, dim: int, max_position_embeddings: int) -> tuple[torch.Tensor, float]:
    """Return (inv_freq [dim/2] float32 on CPU, attention_scaling multiplier for cos/sin)."""
    base = rope.theta
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=torch.float) / dim))
    if rope.rope_type == "default":
        return inv_freq, 1.0
    if rope.rope_type == "linear":
        return inv_freq / rope.factor, 1.0
    if rope.rope_type == "llama3":
        return _llama3(inv_freq, rope), 1.0
    if rope.rope_type == "yarn":
        return _yarn(rope, dim, max_position_embeddings)
    raise ValueError(f"unsupported rope_type {rope.rope_type!r}")


def _llama3(inv_freq: torch.Tensor, rope: RopeConfig) -> torch.Tensor:
    factor, low, high = rope.factor, rope.low_freq_factor, rope.high_freq_factor
    old_context_len = rope.original_max_position_embeddings
    assert old_context_len is not None  # RopeConfig.from_dict fills it for llama3
    low_freq_wavelen = old_context_len / low
    high_freq_wavelen = old_context_len / high
    wavelen = 2 * math.pi / inv_freq
    # Long wavelengths are interpolated by `factor`, short ones kept, the band between smoothly blended.
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * inv_freq_llama / factor + smooth * inv_freq_llama
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, inv_freq_llama)


def _yarn(rope: RopeConfig, dim: int, max_position_embeddings: int) -> tuple[torch.Tensor, float]:
    base, factor = rope.theta, rope.factor
    orig = rope.original_max_position_embeddings or max_position_embeddings

    def get_mscale(scale: float, mscale: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0

    attention_factor = rope.attention_factor
    if attention_factor is None:
        if rope.mscale and rope.mscale_all_dim:
            attention_factor = float(get_mscale(factor, rope.mscale) / get_mscale(factor, rope.mscale_all_dim))
        else:
            attention_factor = get_mscale(factor)

    def correction_dim(num_rotations: float) -> float:
        return (dim * math.log(orig / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # avoid a zero-width ramp
    pos_freqs = base ** (torch.arange(0, dim, 2).to(dtype=torch.float) / dim)
    extrapolation = 1.0 / pos_freqs
    interpolation = 1.0 / (factor * pos_freqs)
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    extra_factor = 1 - ramp
    inv_freq = interpolation * (1 - extra_factor) + extrapolation * extra_factor
    return inv_freq, float(attention_factor)


def apply_rotary_qk(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q [T, Hq, D] and k [T, Hkv, D] with the step's cos/sin [T, Dr] (in q.dtype).

    On CUDA with triton: one in-place kernel for both (q/k may be views of the fused qkv output; the
    results are bit-identical to the torch path). Otherwise the pure-torch path, out of place.
    """
    # --- CUDA fast path (triton_ops/rotary.py); the CPU path below is unchanged.
    if q.is_cuda and q.dtype == k.dtype == cos.dtype == sin.dtype:
        ops = fused_ops()
        if ops is not None:
            return ops.apply_rotary_inplace(q, k, cos, sin)
    return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)


class RotaryEmbedding(nn.Module):
    """Holds inv_freq; ``forward(positions, dtype)`` gives the step's (cos, sin), each [T, rotary_dim]."""

    def __init__(self, head_dim: int, rope: RopeConfig, max_position_embeddings: int) -> None:
        super().__init__()
        self.rope = rope
        self.max_position_embeddings = max_position_embeddings
        self.rotary_dim = int(head_dim * rope.partial_rotary_factor)
        inv_freq, self.attention_scaling = compute_inv_freq(rope, self.rotary_dim, max_position_embeddings)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def reset_buffers(self, device: torch.device) -> None:
        """Recompute inv_freq after ``to_empty`` (a meta-built model has no buffer values)."""
        inv_freq, _ = compute_inv_freq(self.rope, self.rotary_dim, self.max_position_embeddings)
        self.inv_freq = inv_freq.to(device)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        # positions [T] int64 -> cos, sin [T, rotary_dim]; the product and cos/sin in float32 like HF.
        freqs = positions.to(torch.float32)[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = emb.cos() * self.attention_scaling
        sin = emb.sin() * self.attention_scaling
        return cos.to(dtype), sin.to(dtype)
