"""Linear layers with shard-aware weight loading (single device: no tensor parallelism yet).

Fused projections (qkv, gate_up) keep one weight matrix so each layer runs one GEMM; the HF
checkpoint still stores them apart, so each fused parameter carries a ``weight_loader`` that copies
a checkpoint tensor into its slice of the output rows. The loader is a method of the owning module
(not an attribute on the Parameter) because ``to_empty`` re-creates Parameters and drops attributes.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn


def default_weight_loader(param: nn.Parameter, loaded: torch.Tensor) -> None:
    """Copy a whole checkpoint tensor into ``param``, casting to its dtype and device."""
    if param.shape != loaded.shape:
        raise ValueError(f"shape mismatch: parameter {tuple(param.shape)} vs checkpoint {tuple(loaded.shape)}")
    param.data.copy_(loaded)


class Linear(nn.Module):
    """``y = x W^T + b`` with HF's ``weight`` [out, in] / ``bias`` [out] names."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # [T, in] -> [T, out]
        return F.linear(x, self.weight, self.bias)


class MergedLinear(Linear):
    """Several projections of the same input stacked along the output dim (gate_up_proj)."""

    def __init__(self, in_features: int, output_sizes: Sequence[int], bias: bool = False) -> None:
        super().__init__(in_features, sum(output_sizes), bias)
        self.output_sizes = list(output_sizes)

    def _shard_range(self, shard_id: int) -> tuple[int, int]:
        start = sum(self.output_sizes[:shard_id])
        return start, self.output_sizes[shard_id]

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: Optional[int] = None) -> None:
        if shard_id is None:
            default_weight_loader(param, loaded)
            return
        start, size = self._shard_range(shard_id)
        target = param.data.narrow(0, start, size)
        if target.shape != loaded.shape:
            raise ValueError(f"shard {shard_id}: expected {tuple(target.shape)}, got {tuple(loaded.shape)}")
        target.copy_(loaded)


class QKVLinear(MergedLinear):
    """q, k and v projections in one matrix: rows [q (Hq*D) | k (Hkv*D) | v (Hkv*D)]."""

    _SHARDS = {"q": 0, "k": 1, "v": 2}

    def __init__(self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int, bias: bool) -> None:
        self.q_size = num_heads * head_dim
        self.kv_size = num_kv_heads * head_dim
        super().__init__(hidden_size, [self.q_size, self.kv_size, self.kv_size], bias)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:  # type: ignore[override]
        super().weight_loader(param, loaded, self._SHARDS[shard_id] if isinstance(shard_id, str) else shard_id)
