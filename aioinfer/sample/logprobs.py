"""Logprobs of the raw model distribution (vLLM v1's default ``raw_logprobs``)."""

from __future__ import annotations

import torch


def compute_logprobs(raw_logits: torch.Tensor, sampled: torch.Tensor, num_top: int
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Logprob and rank of each sampled token, and the ``num_top`` most likely tokens per row.

    Computed before any penalty, bias or temperature, so they describe what the model said,
    not the knobs the user turned. Returns (sampled_logprobs [N] float32, sampled_ranks [N] int64
    with 1 = most likely, top_token_ids [N, K] int64, top_logprobs [N, K] float32 descending).
    """
    # raw_logits: [N, V] float32; sampled: [N] int64
    logprobs = raw_logits.log_softmax(dim=-1)  # [N, V]
    sampled_logprobs = logprobs.gather(1, sampled.unsqueeze(1))  # [N, 1]
    # Rank = 1 + tokens strictly more likely, so tied tokens share the better rank (as in vLLM).
    ranks = (logprobs > sampled_logprobs).sum(dim=-1) + 1  # [N] int64
    top_logprobs, top_ids = logprobs.topk(num_top, dim=-1)  # [N, K], sorted descending
    return sampled_logprobs.squeeze(1), ranks, top_ids, top_logprobs
