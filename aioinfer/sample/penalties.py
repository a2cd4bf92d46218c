"""Logit processors that run before sampling: logit_bias, min_tokens and the three penalties.

Semantics follow vLLM / OpenAI exactly, so the same request gives the same distribution here:
repetition penalty looks at prompt and output tokens, frequency and presence only at the output.
Per-row token lists arrive as flat indices ``row * V + token`` so that one scatter builds the
``[N, V]`` tensors with no padding and no host sync.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch


@dataclass(slots=True)
class PenaltyTensors:
    """Penalty knobs for one step; a knob no row uses is None and costs nothing."""

    repetition: Optional[torch.Tensor]  # [N] float32, 1.0 = off
    frequency: Optional[torch.Tensor]  # [N] float32, 0.0 = off
    presence: Optional[torch.Tensor]  # [N] float32, 0.0 = off
    prompt_index: Optional[torch.Tensor]  # [P] int64 flat row * V + token; only with a repetition penalty
    output_index: torch.Tensor  # [O] int64 flat row * V + token, one entry per generated token


def apply_logit_bias(logits: torch.Tensor, index: torch.Tensor, value: torch.Tensor) -> None:
    """Add each row's logit_bias in place. ``logits``: [N, V] contiguous float32."""
    logits.view(-1).index_add_(0, index, value)


def apply_min_tokens(logits: torch.Tensor, index: torch.Tensor) -> None:
    """Mask EOS and stop tokens of rows still short of min_tokens, in place. ``logits``: [N, V].

    Except in a row this would leave with no token at all: a grammar's row (its mask already applied)
    whose only continuations are stop tokens, as EOS once a JSON value is complete. The grammar wins
    there: the row keeps them, and the token it samples does not end the request before min_tokens
    (the scheduler's rule for a stop token that early), so the output still matches the grammar.
    Without a grammar no row can be left empty (the raw logits and a bias are finite)."""
    flat = logits.view(-1)
    kept = flat[index]
    flat.index_fill_(0, index, float("-inf"))
    emptied = torch.isneginf(logits.amax(dim=-1))  # [N]; no host sync: the restore below is masked
    kept.masked_fill_(~emptied[torch.div(index, logits.shape[1], rounding_mode="floor")], float("-inf"))
    flat.index_copy_(0, index, kept)


def apply_penalties(logits: torch.Tensor, pen: PenaltyTensors) -> torch.Tensor:
    """Repetition, then frequency, then presence penalty; returns a new [N, V] float32 tensor."""
    # logits: [N, V]
    n, vocab = logits.shape
    # Float counts: exact up to 2**24 occurrences, and the frequency penalty multiplies them as floats.
    counts = torch.zeros(n * vocab, dtype=torch.float32, device=logits.device)
    counts.index_add_(0, pen.output_index, torch.ones_like(pen.output_index, dtype=torch.float32))
    counts = counts.view(n, vocab)  # [N, V] occurrences in the output
    in_output = counts > 0  # [N, V] bool
    if pen.repetition is not None:
        seen = torch.zeros(n * vocab, dtype=torch.bool, device=logits.device)
        seen.index_fill_(0, pen.prompt_index, True)
        seen = seen.view(n, vocab) | in_output
        rep = pen.repetition.unsqueeze(1)  # [N, 1]
        # Dividing positive and multiplying negative logits both make a seen token less likely.
        penalised = torch.where(logits > 0, logits / rep, logits * rep)
        logits = torch.where(seen, penalised, logits)
    if pen.frequency is not None:
        # Two separate ops (no addcmul): keeps the result bit-identical to a plain reference.
        logits = logits - pen.frequency.unsqueeze(1) * counts
    if pen.presence is not None:
        logits = logits - pen.presence.unsqueeze(1) * in_output.to(torch.float32)
    return logits
