"""Token embedding and LM head, with the vocabulary split over tensor-parallel ranks.

Rank r holds rows [r * S, (r + 1) * S) of the [V, H] matrix, S = ceil(V / tp); rows past V (the
last rank's padding) are zero. The embedding looks up only the ids in its range (others give
zeros) and all-reduces; the LM head computes its S columns of logits and all-gathers them, then
drops the padding. Both use the same row split, so a tied LM head still shares the embedding's
parameter. At world size 1, S = V and both are a plain lookup / GEMM.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from aioinfer.distributed.group import SINGLE, TPGroup


class _VocabShard(nn.Module):
    """This rank's rows of a [V, H] vocabulary matrix, and the loader that cuts them out."""

    def __init__(self, vocab_size: int, hidden_size: int, tp: TPGroup) -> None:
        super().__init__()
        self.tp = tp
        self.vocab_size = vocab_size
        self.shard_size = -(-vocab_size // tp.world_size)  # S
        self.vocab_start = tp.rank * self.shard_size
        self.num_rows = max(0, min(self.shard_size, vocab_size - self.vocab_start))  # real rows held
        self.weight = nn.Parameter(torch.empty(self.shard_size, hidden_size), requires_grad=False)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        # loaded: the full [V, H] checkpoint matrix
        if loaded.shape != (self.vocab_size, param.shape[1]):
            raise ValueError(f"expected {(self.vocab_size, param.shape[1])}, got {tuple(loaded.shape)}")
        param.data[:self.num_rows].copy_(loaded.narrow(0, self.vocab_start, self.num_rows))
        param.data[self.num_rows:].zero_()


class VocabEmbedding(_VocabShard):
    def __init__(self, vocab_size: int, hidden_size: int, tp: TPGroup = SINGLE) -> None:
        super().__init__(vocab_size, hidden_size, tp)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        # [T] -> [T, H]
        if not self.tp.is_parallel:
            return F.embedding(input_ids, self.weight)
        local = input_ids - self.vocab_start
        outside = (local < 0) | (local >= self.num_rows)  # ids another rank holds
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        out.masked_fill_(outside.unsqueeze(-1), 0.0)
        return self.tp.all_reduce(out)


class LMHead(_VocabShard):
    """Projects hidden states to vocabulary logits; its weight may be the embedding's (tied)."""

    def __init__(self, vocab_size: int, hidden_size: int, tp: TPGroup = SINGLE) -> None:
        super().__init__(vocab_size, hidden_size, tp)

    def forward(self, hidden: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        # [N, H] -> [N, V] float32; the GEMM runs in the model dtype like HF, the sampler wants float32.
        # ``out``: a float32 [N, V] buffer to write them into (a CUDA graph's static output).
        logits = F.linear(hidden, self.weight)  # [N, S]
        if self.tp.is_parallel:
            logits = self.tp.all_gather_last_dim(logits)[:, :self.vocab_size]  # [N, tp * S] -> [N, V]
        return logits.float() if out is None else out.copy_(logits)
