"""Linear layers with shard-aware weight loading, replicated or split over tensor-parallel ranks.

Fused projections (qkv, gate_up) keep one weight matrix so each layer runs one GEMM; the HF
checkpoint still stores them apart, so each fused parameter carries a ``weight_loader`` that copies
a checkpoint tensor into its slice of the output rows. The loader is a method of the owning module
(not an attribute on the Parameter) because ``to_empty`` re-creates Parameters and drops attributes.

Tensor parallelism (Megatron's split): a column-parallel layer keeps 1/tp of the output rows of
each stacked projection (q/k/v by heads, gate and up by halves) and needs no communication; the
row-parallel layer after it keeps 1/tp of the input columns and sums the partial products over
the ranks (one all-reduce per attention block and one per MLP). Loaders always receive the full
checkpoint tensor and cut this rank's part out of it. At world size 1 every layer is a plain
``F.linear``, except small-batch fp16/bf16 products on CUDA (decode at batch 1, and at up to 8 for
wide projections such as gate_up), which run the Triton kernel of triton_ops/small_batch_linear.py:
cuBLAS leaves ~10% of the bandwidth unused there.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from aioinfer.distributed.group import SINGLE, TPGroup
from aioinfer.layers.triton_ops import fused_ops  # imports no triton; fused_ops() does, on first CUDA call

# Rows up to which fp16/bf16 products on CUDA use the small-batch kernel (benchmarks/probes/gemv_sweep.py on
# the H200): every projection at 1 row; at 2-8 rows only wide ones (out >= 4 x in: gate_up), where
# the kernel beat cuBLAS by ~8%, while cuBLAS tied or won on qkv, o and down. float32 stays on
# cuBLAS (the exactness tests compare it with HF).
SMALL_BATCH_ROWS = 1
WIDE_BATCH_ROWS = 8


def default_weight_loader(param: nn.Parameter, loaded: torch.Tensor) -> None:
    """Copy a whole checkpoint tensor into ``param``, casting to its dtype and device."""
    if param.shape != loaded.shape:
        raise ValueError(f"shape mismatch: parameter {tuple(param.shape)} vs checkpoint {tuple(loaded.shape)}")
    param.data.copy_(loaded)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """``F.linear``, or the small-batch kernel for a few-row half-precision input on CUDA."""
    rows = x.shape[0]
    if (x.is_cuda and x.dim() == 2 and x.dtype in (torch.float16, torch.bfloat16) and x.dtype == weight.dtype
            and (rows <= SMALL_BATCH_ROWS or (rows <= WIDE_BATCH_ROWS and weight.shape[0] >= 4 * weight.shape[1]))):
        ops = fused_ops()
        if ops is not None:
            return ops.small_batch_linear(x, weight, bias)
    return F.linear(x, weight, bias)


class Linear(nn.Module):
    """``y = x W^T + b`` with HF's ``weight`` [out, in] / ``bias`` [out] names."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False) if bias else None
        # FP8 weights: an Fp8Linear (layers/quantization/fp8_linear.py) that owns the weight's dtype,
        # its scales, their loading and the product; None: a plain half/float weight.
        self.quant = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # [T, in] -> [T, out]
        return self.product(x, self.bias)

    def product(self, x: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        """``x W^T + bias`` with this layer's weight, plain or quantized."""
        if self.quant is not None:
            return self.quant.apply(self, x, bias)
        return linear(x, self.weight, bias)

    # Where checkpoint tensors go: the quantized loader shares these with the plain one.
    def rows(self, shard_id=None) -> tuple[int, int]:
        """(first row, rows) of this rank's parameter that checkpoint piece ``shard_id`` fills."""
        return 0, self.out_features

    def rank_part(self, loaded: torch.Tensor, shard_id=None, unit: tuple[int, int] = (1, 1)) -> torch.Tensor:
        """The part of a whole checkpoint tensor this rank keeps (``unit``: rows and columns per
        element, for block scales)."""
        return loaded

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        if self.quant is not None and self.quant.load(self, param, loaded, shard_id):
            return
        default_weight_loader(param, loaded)


class MergedLinear(Linear):
    """Column-parallel: several projections of the same input stacked along the output dim
    (gate_up_proj); each rank holds its 1/tp of every projection, in the same stacked order."""

    def __init__(self, in_features: int, output_sizes: Sequence[int], bias: bool = False,
                 tp: TPGroup = SINGLE, names: Optional[Sequence[str]] = None) -> None:
        self.tp = tp
        names = names or [f"output {i}" for i in range(len(output_sizes))]
        self.output_sizes = [tp.shard(size, name) for size, name in zip(output_sizes, names)]  # this rank's
        super().__init__(in_features, sum(self.output_sizes), bias)

    def _shard_range(self, shard_id: int) -> tuple[int, int]:
        start = sum(self.output_sizes[:shard_id])
        return start, self.output_sizes[shard_id]

    def _shard(self, shard_id) -> Optional[int]:
        """The stacked projection a checkpoint tensor fills; None: a pre-fused one, whole (one rank)."""
        if shard_id is None:
            if not self.tp.is_parallel:
                return None
            if len(self.output_sizes) != 1:
                raise ValueError("a pre-fused checkpoint tensor cannot be split over tensor-parallel ranks")
            return 0
        return shard_id

    def rows(self, shard_id=None) -> tuple[int, int]:
        shard = self._shard(shard_id)
        return (0, self.out_features) if shard is None else self._shard_range(shard)

    def rank_part(self, loaded: torch.Tensor, shard_id=None, unit: tuple[int, int] = (1, 1)) -> torch.Tensor:
        shard = self._shard(shard_id)
        if shard is None:
            return loaded
        size = self._shard_range(shard)[1] // unit[0]
        if loaded.shape[0] != size * self.tp.world_size:
            raise ValueError(f"shard {shard_id}: expected {size * self.tp.world_size} rows, got {tuple(loaded.shape)}")
        return loaded.narrow(0, self.tp.rank * size, size)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: Optional[int] = None) -> None:
        # loaded: one full (unsharded) checkpoint projection, [out_i, in] or [out_i] for a bias.
        if self.quant is not None and self.quant.load(self, param, loaded, shard_id):
            return
        start, size = self.rows(shard_id)
        part = self.rank_part(loaded, shard_id)
        target = param.data.narrow(0, start, size)
        if target.shape != part.shape:
            raise ValueError(f"shard {shard_id}: expected {tuple(target.shape)}, got {tuple(part.shape)} "
                             f"of {tuple(loaded.shape)}")
        target.copy_(part)


class QKVLinear(MergedLinear):
    """q, k and v projections in one matrix: rows [q (Hq*D) | k (Hkv*D) | v (Hkv*D)], each rank
    holding Hq/tp query heads and Hkv/tp KV heads (whole heads, so attention needs no communication)."""

    _SHARDS = {"q": 0, "k": 1, "v": 2}

    def __init__(self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int, bias: bool,
                 tp: TPGroup = SINGLE) -> None:
        self.num_heads = tp.shard(num_heads, "num_attention_heads")  # this rank's
        self.num_kv_heads = tp.shard(num_kv_heads, "num_key_value_heads")
        self.q_size = self.num_heads * head_dim
        self.kv_size = self.num_kv_heads * head_dim
        super().__init__(hidden_size, [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim],
                         bias, tp)

    def _shard(self, shard_id) -> Optional[int]:
        return super()._shard(self._SHARDS[shard_id] if isinstance(shard_id, str) else shard_id)


class RowParallelLinear(Linear):
    """``y = sum over ranks of x_r W_r^T (+ b)``: each rank holds 1/tp of the input columns (o_proj,
    down_proj), takes its slice of the activations from the column-parallel layer before, and the
    partial outputs are all-reduced. The bias is whole on every rank and added once (by rank 0,
    inside its GEMM, before the sum)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False, tp: TPGroup = SINGLE,
                 name: str = "in_features") -> None:
        self.tp = tp
        super().__init__(tp.shard(in_features, name), out_features, bias)

    def rank_part(self, loaded: torch.Tensor, shard_id=None, unit: tuple[int, int] = (1, 1)) -> torch.Tensor:
        if loaded.dim() == 1:  # the bias and per-row scales: output rows are not split
            return loaded
        size = self.in_features // unit[1]
        if loaded.shape[1] != size * self.tp.world_size:
            raise ValueError(f"expected {size * self.tp.world_size} columns, got {tuple(loaded.shape)}")
        return loaded.narrow(1, self.tp.rank * size, size)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: Optional[int] = None) -> None:
        if self.quant is not None and self.quant.load(self, param, loaded, shard_id):
            return
        if param.dim() == 2 and loaded.shape != (param.shape[0], self.in_features * self.tp.world_size):
            raise ValueError(f"expected {(param.shape[0], self.in_features * self.tp.world_size)}, "
                             f"got {tuple(loaded.shape)}")
        default_weight_loader(param, self.rank_part(loaded))

    def forward(self, x: torch.Tensor, reduce: bool = True) -> torch.Tensor:
        # [T, in/tp] -> [T, out]; reduce=False: this rank's partial sum (the caller reduces it, fused
        # with the residual add and RMSNorm that follow: TPGroup.all_reduce_add_rms_norm)
        if not self.tp.is_parallel:
            return self.product(x, self.bias)
        partial = self.product(x, self.bias if self.tp.rank == 0 else None)
        return self.tp.all_reduce(partial) if reduce else partial
