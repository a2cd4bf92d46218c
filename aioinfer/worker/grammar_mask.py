"""Structured outputs in the step: each constrained row's allowed tokens as a bitmask, applied to the logits.

In lockstep the model runner calls ``fill`` after it has enqueued the step's forward, so the host
computes the masks (llguidance, in its own threads without the GIL) while the device computes the
logits. Under async scheduling a step is launched before the previous step's tokens are on the host:
its forward is enqueued at once and its masks planned (``plan``); once those tokens are collected the
matchers take them and a worker thread computes the masks (``start``; grammar_worker.py) while the
engine handles the collected step, schedules the next and prepares its inputs, asking between those
tasks whether the masks are ready (``poll``: then it starts their copy, beside the forward, and the
step is sampled, ``finish_fill`` and ``apply``, at once); at the latest it is sampled just before
the next one is launched. One pinned host-to-device copy carries the masks, and ``apply`` sets
every disallowed logit to -inf on the device before the sampler sees them (so logprobs are those
of the masked distribution, as in vLLM). A request with drafts has one mask per row: the mask after each draft, computed by advancing its matcher through the drafts
and back (llguidance stops at a draft the grammar rejects; the rows after it are discarded by
verification anyway, since that draft is not in the mask before it).

Tensor parallelism: rank 0 holds the matchers, computes the masks and broadcasts them over the
device group at sampling; the other ranks' requests carry ``REMOTE_GRAMMAR`` instead, and they
receive the masks (every rank samples the same tokens, so every rank applies the same masks).

``AIOINFER_GRAMMAR_THREADS``: llguidance's thread count (default: its own, 80 % of the cores).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from aioinfer.worker.bitmask_apply import apply_bitmask
from aioinfer.worker.grammar_worker import HANDOFF, GrammarWorker, MaskJob
from aioinfer.worker.sampling_metadata import SamplingRow, host_to_device

logger = logging.getLogger(__name__)


class RemoteGrammar:
    """A request's matcher as a tensor-parallel rank other than 0 sees it: rank 0 has the matcher and
    sends the masks; this rank never advances it (hence ``is_stopped``: there is nothing to advance)."""

    __slots__ = ()

    def is_stopped(self) -> bool:
        return True

    def __reduce__(self):
        return (_remote_grammar, ())


REMOTE_GRAMMAR = RemoteGrammar()


def _remote_grammar() -> RemoteGrammar:
    return REMOTE_GRAMMAR


@dataclass(slots=True)
class StepMask:
    bits: torch.Tensor  # [G, W] int32 on the device: bit j of word w allows token 32 w + j
    rows: Optional[torch.Tensor]  # [G] int64 logits rows the masks belong to; None: every row, in order
    grammar_states: list[int]  # indices (in the step's sampled states) of the requests with a grammar


@dataclass(slots=True)
class PendingMask:
    """A step's masks, planned when it is launched and computed into ``host`` (pinned on CUDA) once
    the tokens before them are known."""

    host: Optional[torch.Tensor]  # [G, W] int32; None on a rank that receives the masks
    rows: list[int]
    num_rows: int  # the step's sampled rows
    grammar_states: list[int]
    plain: list  # (matcher, its mask row) of the requests without drafts
    with_drafts: list  # (matcher, its first mask row, its drafts) of those with drafts
    job: Optional[MaskJob] = None  # the worker's, once started
    bits: Optional[torch.Tensor] = None  # on the device, once ``copied`` (CUDA: its copy started by ``poll``)
    copied: Optional[torch.cuda.Event] = None


class GrammarMasks:
    def __init__(self, vocab_size: int, device: torch.device) -> None:
        self.vocab_size = vocab_size
        self.num_words = (vocab_size + 31) // 32
        self.device = device
        self._worker: Optional[GrammarWorker] = None  # its thread and llguidance's executor, made at first use
        # The CPUs llguidance's threads may use: the process's now, before a ``host_cpu`` engine
        # thread is pinned to one of them (host_cpu.py).
        self._cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
        self._copy_stream = None  # the masks' host-to-device copies (``_copy_to_device``), made at first use
        self._group = None  # tensor parallelism (``share_over``): rank 0 sends the masks, the others receive
        # For benchmarks: the worker's time a step (advance, masks), the time from masks computed to
        # their copy started, and the engine thread's wait for the masks at sampling.
        self.fill_seconds = 0.0
        self.copy_start_seconds = 0.0
        self.wait_seconds = 0.0
        self.num_fills = 0
        self.num_rejected = 0  # sampled tokens a matcher refused: always 0 unless the masks are wrong

    def share_over(self, group) -> None:
        """Tensor parallelism: every step's masks go from rank 0 to the group's other ranks."""
        self._group = group if group.is_parallel else None

    @property
    def _receives(self) -> bool:
        return self._group is not None and self._group.rank > 0

    def advance(self, live: Sequence[tuple[object, int]]) -> None:
        """Each matcher takes its one new token (``live``: (matcher, token) pairs, ``live_tokens``'s:
        a stopped matcher, complete with only EOS allowed, takes none), in llguidance's threads (one call for the batch, without the GIL:
        256 matchers one by one held the GIL about 0.5 ms a step). The tokens were sampled under the
        masks, so they fit; a failure means a bug, and the matcher's error state then allows EOS only."""
        self._consume(live)

    def _consume(self, live: list) -> None:
        if not live:
            return
        accepted = self._llg_executor().consume_token_par(live)
        if not all(accepted):
            self.num_rejected += _log_rejected(live, accepted)

    def _llg_executor(self):
        return self._grammar_worker().executor

    def _grammar_worker(self) -> GrammarWorker:
        if self._worker is None:
            threads = os.environ.get("AIOINFER_GRAMMAR_THREADS")
            self._worker = GrammarWorker(int(threads) if threads else None, self._cpus, HANDOFF)
        return self._worker

    def close(self) -> None:
        """End the worker thread (idempotent; a dropped GrammarMasks ends it too)."""
        if self._worker is not None:
            self._worker.close()
            self._worker = None

    def fill(self, states: Sequence[SamplingRow], drafts: Optional[Sequence[list[int]]]) -> Optional[StepMask]:
        """Masks for the rows of requests with a grammar, or None when the step has none."""
        return self.finish_fill(self.plan(states, drafts))

    def plan(self, states: Sequence[SamplingRow], drafts: Optional[Sequence[list[int]]] = None,
             tokens_known: bool = True) -> Optional[PendingMask]:
        """The masks a step needs (which rows, a buffer for them), or None when it has none; computed by
        ``start`` (in the worker) or ``finish_fill`` (here). ``tokens_known=False``: a step launched
        ahead, planned before the tokens of the step before it are collected (and its matchers
        advanced by them: only then may ``start`` run)."""
        if drafts is None:  # one row a request: a mask row is its state's row (the common step, kept short)
            grammar_states = [i for i, state in enumerate(states) if state.grammar is not None]
            if not grammar_states:
                return None
            assert not tokens_known or all(states[i].num_pending_tokens == 0 for i in grammar_states), \
                "a grammar with tokens still on the device"
            plain = [(states[i].grammar, k) for k, i in enumerate(grammar_states)]
            return PendingMask(self._host_buffer(len(grammar_states), drafts), grammar_states, len(states),
                               grammar_states, plain, [])
        plain, with_drafts = [], []  # as llguidance takes them (it refuses an empty draft list)
        rows: list[int] = []
        grammar_states: list[int] = []
        num_rows = 0
        for i, state in enumerate(states):
            width = 1 + (len(drafts[i]) if drafts is not None else 0)
            if state.grammar is not None:
                # A mask follows every token before it: the engine computes it once they are known.
                assert not tokens_known or state.num_pending_tokens == 0, "a grammar with tokens still on the device"
                if drafts is not None and drafts[i]:
                    with_drafts.append((state.grammar, len(rows), list(drafts[i])))
                else:
                    plain.append((state.grammar, len(rows)))
                rows.extend(range(num_rows, num_rows + width))
                grammar_states.append(i)
            num_rows += width
        if not rows:
            return None
        return PendingMask(self._host_buffer(len(rows), drafts), rows, num_rows, grammar_states, plain, with_drafts)

    def _host_buffer(self, num_rows: int, drafts) -> Optional[torch.Tensor]:
        """Where the executor writes the masks (pinned on CUDA); None on a rank that receives them."""
        if self._receives:
            return None
        pinned = self.device.type == "cuda"
        if drafts is None:  # the executor writes every row whole: no need to clear 4.9 MB (256 rows, 151k vocab)
            return torch.empty((num_rows, self.num_words), dtype=torch.int32, pin_memory=pinned)
        # Rows after a draft the grammar rejects are left as they are: all allowed (and discarded).
        return torch.full((num_rows, self.num_words), -1, dtype=torch.int32, pin_memory=pinned)

    def start(self, pending: Optional[PendingMask], live: Sequence[tuple[object, int]] = ()) -> None:
        """``advance`` by ``live`` (the tokens just collected), then compute ``pending``'s masks, in
        the worker thread while the caller goes on (grammar_worker.py: it only calls llguidance);
        ``poll`` and ``finish_fill`` start their copy to the device once they are computed."""
        if pending is None:
            self.advance(live)
            return
        worker = self._grammar_worker()
        host = pending.host
        pending.job = MaskJob(live, pending.plain, pending.with_drafts, host.data_ptr(), self.num_words * 4,
                              host.shape[0])
        worker.submit(pending.job)

    def poll(self, pending: Optional[PendingMask]) -> bool:
        """Start the copy of ``pending``'s masks if the worker has computed them (never waits): the
        engine thread calls this between its host tasks, so that the copy runs while the step's
        forward still computes. True when they are computed (``finish_fill`` would not wait)."""
        if pending is None:
            return True
        job = pending.job
        if job is None:  # not started (finish_fill computes them) or received from rank 0
            return False
        if pending.copied is not None:
            return True
        if not job.is_done():
            return False
        if self.device.type == "cuda":
            self._take_job(pending)
            self._copy_to_device(pending)
        return True

    def finish_fill(self, pending: Optional[PendingMask]) -> Optional[StepMask]:
        """The masks of ``pending`` on the device (one copy from pinned memory), computed here if no
        worker has started on them; None for None."""
        if pending is None:
            return None
        if self._receives:
            bits = torch.empty((len(pending.rows), self.num_words), dtype=torch.int32, device=self.device)
            self._group.broadcast_tensor(bits)
        else:
            if pending.job is None:
                self._compute(pending)
            elif pending.copied is None:
                waited = time.perf_counter()
                pending.job.wait()
                self.wait_seconds += time.perf_counter() - waited
                self._take_job(pending)
            if pending.copied is not None:
                compute = torch.cuda.current_stream(self.device)
                compute.wait_event(pending.copied)
                bits = pending.bits
                bits.record_stream(compute)  # its memory is not reused before the sampling has read it
            else:  # the CPU (or masks computed here: then copied on the compute stream, after the forward)
                bits = pending.host.to(self.device, non_blocking=True) if self.device.type == "cuda" else pending.host
            if self._group is not None:
                self._group.broadcast_tensor(bits)
        index = None if len(pending.rows) == pending.num_rows else host_to_device(pending.rows, torch.int64, self.device)
        return StepMask(bits, index, pending.grammar_states)

    def _take_job(self, pending: PendingMask) -> None:
        """The worker is done with ``pending``'s job: its timings counted, its errors raised or logged."""
        job = pending.job
        job.wait()
        if job.rejected is not None:
            self.num_rejected += _log_rejected(job.live, job.rejected)
        self.fill_seconds += job.finished - job.started
        self.copy_start_seconds += time.perf_counter() - job.finished
        self.num_fills += 1

    def _copy_to_device(self, pending: PendingMask) -> None:
        """Start the masks' one host-to-device copy (4.9 MB at 256 rows of Qwen2.5's vocabulary: about
        0.25 ms of the H200's copy engine) on a stream of its own: it then runs while the step's
        forward still computes, instead of after it on the compute stream, where it held up every
        constrained step's sampling. ``finish_fill`` makes the compute stream wait for it."""
        if self._copy_stream is None:
            self._copy_stream = torch.cuda.Stream(self.device)
        with torch.cuda.stream(self._copy_stream):  # made on the stream that writes it
            pending.bits = pending.host.to(self.device, non_blocking=True)
            pending.copied = torch.cuda.Event()
            pending.copied.record(self._copy_stream)

    def _compute(self, pending: PendingMask) -> None:
        """The masks computed on the calling thread (lockstep: the step's forward is already enqueued)."""
        # The executor writes row k of the mask at data_ptr + k * row bytes (llguidance.torch's helpers
        # do the same, but importing that module costs seconds: it compiles a kernel with torch.compile).
        executor = self._llg_executor()
        host = pending.host
        row_bytes, num_rows = self.num_words * 4, host.shape[0]
        if pending.plain:
            executor.unsafe_compute_mask_ptr(pending.plain, host.data_ptr(), row_bytes, num_rows)
        if pending.with_drafts:
            executor.unsafe_compute_mask_ptr_with_draft_token(pending.with_drafts, host.data_ptr(), row_bytes, num_rows)

    def apply(self, logits: torch.Tensor, mask: StepMask) -> torch.Tensor:
        """Disallowed tokens' logits to -inf, in place ([N, V]; the rows without a grammar unchanged)."""
        return apply_bitmask(logits, mask.bits, mask.rows)


def live_tokens(states: Sequence[SamplingRow], token_ids: Sequence[int], indices: Sequence[int]) -> list:
    """(matcher, token) for the states at ``indices`` whose matcher is not stopped (one pass: this
    runs every step on the engine thread)."""
    return [(grammar, token_ids[i]) for i in indices if not (grammar := states[i].grammar).is_stopped()]


def _log_rejected(live: Sequence, accepted: Sequence[bool]) -> int:
    """Log each token a matcher rejected (a bug: the tokens were sampled under its mask); their count."""
    rejected = 0
    for (matcher, token_id), ok in zip(live, accepted):
        if not ok:
            rejected += 1
            logger.error("structured outputs: the grammar rejected sampled token %d: %s", token_id, matcher.get_error())
    return rejected
