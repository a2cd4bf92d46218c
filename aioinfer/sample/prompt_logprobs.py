"""Prompt logprobs (``SamplingParams.prompt_logprobs``) with bounded memory.

A prompt token's logprob needs the logits of the position before it, so a request that asks for them
needs the logits of every prompt position, not only the last one: [prompt_len, vocab] float32 is
600 MB for 1k tokens of a 151k vocabulary (what vLLM users ran out of memory on, vllm#5907). Here
nothing of that size exists at any time:

- each prefill chunk (the scheduler's grants, within the step's token budget) scores the prompt
  positions it computed, from the hidden states the forward already produced;
- within a chunk, the LM head runs on slices of at most ``rows_per_slice`` positions (a slice's
  logits stay under ``SLICE_BYTES``), and each slice is reduced on the device to what is kept: the
  prompt token's logprob and rank, the top-N ids and logprobs;
- those small rows go to the host with the step's results (pinned memory, one event, no extra sync).

Every rank of a tensor-parallel group runs the same slices (the LM head all-gathers its logits, a
collective each rank must join in the same order); only rank 0's rows leave the engine.

A position is scored once: ``next_position`` only moves forward, so a request preempted and
recomputed (its chunks granted again from position 0) skips the rows it already has. Positions
served from the prefix cache have no hidden states: the scheduler gives such a request no cached
blocks until its prompt is done (core/scheduler.py, ``_admit_blocks``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from aioinfer.core.scheduler_output import NewRequestData, PromptLogprobRows, ScheduledRequest
from aioinfer.sampling_params import num_logprobs
from aioinfer.sample.logprobs import compute_logprobs
from aioinfer.sample.sampling_metadata import host_to_device

SLICE_BYTES = 64 << 20  # the most the LM head and the reduction of one slice hold at once, roughly


def rows_per_slice(vocab_size: int, num_top: int) -> int:
    """Positions per slice: float32 logits and their log-softmax (8 bytes an entry), plus the top-N
    values and ids (12 bytes each) of the slice's rows."""
    return max(1, SLICE_BYTES // (8 * vocab_size + 12 * num_top))


@dataclass(slots=True)
class _Wanted:
    prompt_token_ids: list[int]
    num_top: int  # top-N per row (the vocabulary for -1)
    next_position: int = 0  # the first prompt position whose logits are still to score


@dataclass(slots=True)
class _Run:
    """One request's positions in one step: flat rows ``[start, end)`` of the step's hidden states."""

    request_id: str
    first_position: int  # prompt index of the token the first row scores
    start: int
    end: int
    targets: list[int]  # the prompt tokens the rows score
    num_top: int


@dataclass(slots=True)
class PendingPromptLogprobs:
    """A step's rows, computed or enqueued on the device; ``collect`` turns them into Python lists."""

    runs: list[_Run]
    tensors: list[tuple[torch.Tensor, ...]]  # per run: (logprobs [R], ranks [R], top ids [R, K], top logprobs [R, K])
    ready: Optional[torch.cuda.Event]  # recorded after the host copies; None on CPU


class PromptLogprobs:
    """The runner's prompt-logprob state: which requests still need rows, and from which position."""

    def __init__(self, vocab_size: int, device: torch.device) -> None:
        self.vocab_size = vocab_size
        self.device = device
        self._wanted: dict[str, _Wanted] = {}

    def __bool__(self) -> bool:
        """Whether any request still needs rows (the decode hot path asks only this)."""
        return bool(self._wanted)

    def add(self, new: NewRequestData) -> None:
        wanted = new.sampling_params.prompt_logprobs
        if wanted is not None and len(new.prompt_token_ids) > 1:  # a 1-token prompt has no rows
            self._wanted[new.request_id] = _Wanted(new.prompt_token_ids, num_logprobs(wanted, self.vocab_size))

    def forget(self, request_ids: Sequence[str]) -> None:
        for request_id in request_ids:
            self._wanted.pop(request_id, None)

    def plan(self, scheduled: list[ScheduledRequest], query_start_loc: list[int]) -> list[_Run]:
        """The step's runs (host work, at prepare): position p of a chunk scores prompt token p + 1,
        for p below the prompt's last position (whose logits sample the first token)."""
        runs: list[_Run] = []
        for i, item in enumerate(scheduled):
            wanted = self._wanted.get(item.request_id)
            if wanted is None:
                continue
            start = item.start_position
            last = len(wanted.prompt_token_ids) - 1
            lo = max(start, wanted.next_position)
            hi = min(start + len(item.token_ids), last)
            if lo >= hi:
                continue
            base = query_start_loc[i] - start
            runs.append(_Run(item.request_id, lo + 1, base + lo, base + hi,
                             wanted.prompt_token_ids[lo + 1:hi + 1], wanted.num_top))
            wanted.next_position = hi
            if hi == last:
                del self._wanted[item.request_id]  # complete: its later chunks and decode steps cost nothing
        return runs

    @torch.inference_mode()
    def compute(self, model: torch.nn.Module, hidden: torch.Tensor, runs: list[_Run]) -> PendingPromptLogprobs:
        """Enqueue the runs' slices and their copies to the host (no host sync). ``hidden``: the step's
        final-normed hidden states [num_tokens, H]."""
        tensors = []
        for run in runs:
            targets = host_to_device(run.targets, torch.int64, self.device)  # [R]
            step = rows_per_slice(self.vocab_size, run.num_top)
            parts = []
            for lo in range(run.start, run.end, step):
                hi = min(lo + step, run.end)
                logits = model.compute_logits(hidden[lo:hi])  # [r, V] float32
                parts.append(compute_logprobs(logits, targets[lo - run.start:hi - run.start], run.num_top))
            tensors.append(tuple(torch.cat(column) if len(parts) > 1 else column[0] for column in zip(*parts)))
        ready = None
        if self.device.type == "cuda":
            # Fresh pinned buffers per step: two steps in flight never share one (as the sampler's copies).
            tensors = [tuple(torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t, non_blocking=True)
                             for t in run_tensors) for run_tensors in tensors]
            ready = torch.cuda.Event()
            ready.record()
        return PendingPromptLogprobs(runs, tensors, ready)

    @staticmethod
    def collect(pending: PendingPromptLogprobs) -> list[PromptLogprobRows]:
        """The step's rows as Python lists (waits for this step's copies only)."""
        if pending.ready is not None:
            pending.ready.synchronize()
        out = []
        for run, (logprobs, ranks, top_ids, top_logprobs) in zip(pending.runs, pending.tensors):
            out.append(PromptLogprobRows(run.request_id, run.first_position, logprobs.tolist(), ranks.tolist(),
                                         top_ids.tolist(), top_logprobs.tolist()))
        return out
