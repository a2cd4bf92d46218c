"""The attention layer: writes the step's K/V into this layer's paged cache, then calls the backend.

It also holds the layer's KV-cache scales (``k_scale``, ``v_scale``: Python floats, 1.0 unless the
checkpoint carried calibrated ones, layers/kv_scales.py), which the backend applies when the cache
is fp8 and ignores otherwise. Floats, not tensors or parameters: they are fixed after load, cost no
device read per step, are baked into captured CUDA graphs, and a checkpoint without them still
has every parameter the loader expects.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from aioinfer.attention.backend import AttentionBackend
from aioinfer.attention.context import get_attention_metadata


class Attention(nn.Module):
    """Paged causal attention for one decoder layer.

    ``kv_cache`` is set by the model runner: (key_cache, value_cache), each
    [num_blocks, block_size, num_kv_heads, head_dim]. With no cache set (profiling runs), every
    sequence in the batch must be a full prefill and attention runs on the fresh K/V directly.
    ``k_scale`` / ``v_scale``: an fp8 cache stores ``k / k_scale`` and ``v / v_scale``.
    """

    def __init__(
        self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float, backend: AttentionBackend
    ) -> None:
        super().__init__()
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale
        self.backend = backend
        self.kv_cache: Optional[tuple[torch.Tensor, torch.Tensor]] = None
        self.k_scale = 1.0  # vLLM's default when the checkpoint has no calibrated scales
        self.v_scale = 1.0

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # q [T, Hq, D], k/v [T, Hkv, D] -> [T, Hq*D]
        metadata = get_attention_metadata()
        if self.kv_cache is None:
            out = self.backend.forward_no_cache(q, k, v, metadata, self.scale)
        else:
            key_cache, value_cache = self.kv_cache
            self.backend.write_kv(k, v, key_cache, value_cache, metadata.slot_mapping, self.k_scale, self.v_scale)
            out = self.backend.forward(q, key_cache, value_cache, metadata, self.scale, self.k_scale, self.v_scale)
        return out.reshape(out.shape[0], self.num_heads * self.head_dim)
