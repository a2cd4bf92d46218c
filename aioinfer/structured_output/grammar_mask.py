"""Structured outputs in the step: each constrained row's allowed tokens as a bitmask, applied to the logits.

In lockstep the model runner calls ``fill`` after it has enqueued the step's forward, so the host
computes the masks (llguidance, in its own threads without the GIL) while the device computes the
logits. Under async scheduling a step is launched before the previous step's tokens are on the host:
its forward is enqueued at once and its masks planned (``plan``); once those tokens are collected the
matchers take them and a worker thread computes the masks (``start``; grammar_worker.py) while the
engine handles the collected step, schedules the next and prepares its inputs, asking between those
tasks whether the masks are ready (``poll``: then it starts their copy, beside the forward, and the
step is sampled, ``finish_fill`` and ``apply``, at once); at the latest it is sampled just before
the next one is launched. The masks reach the device in one transfer from pinned memory: a step
launched ahead has them in one of two slots made once, copied to the slot's device rows on a stream
of their own beside the forward (mask_slots.py); a lockstep step copies its buffer on the compute
stream. ``apply`` sets every disallowed logit to -inf on the device before the sampler sees them
(so logprobs are those of the masked distribution, as in vLLM). A request with drafts has one mask
per row: the mask after each draft, computed by advancing its matcher through the drafts and back
(llguidance stops at a draft the grammar rejects, whose rows after are discarded by verification
anyway, and once the grammar is complete, whose rows after must allow EOS only:
``_extend_past_stops``).

A matcher that meets one of llguidance's limits mid-output (lexer fuel, Earley items a row), or a
dead end of its grammar, enters its error state, whose mask allows EOS only: the request would end
with "stop" and text that breaks its constraint. The engine asks ``failure`` about each constrained
request that ends, and ends it with an error instead (engine/engine_core.py). A matcher is the worker's
while a job runs (llguidance refuses a second thread: "Already mutably borrowed"), so under async
scheduling ``start`` looks first, before it hands the matchers over: a matcher in error has had its
EOS-only mask, so its request has just sampled EOS; only those rows are asked (``_note_failures``),
and a step without EOS costs one list scan in C.

Tensor parallelism: rank 0 holds the matchers, computes the masks and broadcasts them over the
device group at sampling; the other ranks' requests carry ``REMOTE_GRAMMAR`` instead, and they
receive the masks (every rank samples the same tokens, so every rank applies the same masks).

``AIOINFER_GRAMMAR_THREADS``: llguidance's thread count (default ``default_grammar_threads``: half
the CPUs the process may use, at most 4).
"""

from __future__ import annotations

import logging
import operator
import os
import time
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from aioinfer.structured_output.bitmask_apply import apply_bitmask
from aioinfer.structured_output.grammar_worker import HANDOFF, GrammarWorker, MaskJob
from aioinfer.structured_output.mask_slots import MaskSlot, MaskSlots
from aioinfer.sample.sampling_metadata import SamplingRow, host_to_device

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
    matchers: list  # their matchers, in that order (the next tokens' ``live_tokens``)


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
    matchers: list  # the matchers of grammar_states, in order
    slot: Optional[MaskSlot] = None  # a step launched ahead: its slot (``host`` is that slot's first rows)
    job: Optional[MaskJob] = None  # the worker's, once started
    copied: bool = False  # its copy to the slot's device rows started (by ``poll`` or ``finish_fill``)


class GrammarMasks:
    def __init__(self, vocab_size: int, device: torch.device, max_rows: int = 256) -> None:
        self.vocab_size = vocab_size
        self.num_words = (vocab_size + 31) // 32
        self.device = device
        self._max_rows = max_rows  # the slots' first size: a step's sampled rows at most (max_num_seqs)
        self._slots: Optional[MaskSlots] = None  # steps launched ahead: their masks' buffers, made at first use
        self._last_plan = ([], [], [], [])  # (states, grammar_states, plain, matchers) of the last one-row plan
        self._worker: Optional[GrammarWorker] = None  # its thread and llguidance's executor, made at first use
        # The CPUs llguidance's threads may use: the process's now, before a ``host_cpu`` engine
        # thread is pinned to one of them (async_engine/host_cpu.py).
        self._cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
        self._group = None  # tensor parallelism (``share_over``): rank 0 sends the masks, the others receive
        # For benchmarks: the worker's time a step (advance, masks), the time from masks computed to
        # their copy started, and the engine thread's wait for the masks at sampling.
        self.fill_seconds = 0.0
        self.copy_start_seconds = 0.0
        self.wait_seconds = 0.0
        self.num_fills = 0
        self.num_rejected = 0  # sampled tokens a matcher refused: a mask bug, or a limit met consuming it
        self._eos: tuple[int, ...] = ()  # the model's EOS ids (those of the first constrained row planned)
        self._failed: dict[int, tuple[object, str]] = {}  # id(matcher) -> (matcher, its error), seen by ``start``
        self._job: Optional[MaskJob] = None  # the last job handed to the worker

    def share_over(self, group) -> None:
        """Tensor parallelism: every step's masks go from rank 0 to the group's other ranks."""
        self._group = group if group.is_parallel else None

    @property
    def _receives(self) -> bool:
        return self._group is not None and self._group.rank > 0

    def advance(self, live: Sequence[tuple[object, int]]) -> None:
        """Each matcher takes its one new token (``live``: (matcher, token) pairs, ``live_tokens``'s: a
        stopped matcher takes the EOS its mask allowed), in llguidance's threads (one call for the batch,
        without the GIL: 256 matchers one by one held the GIL about 0.5 ms a step). The tokens were
        sampled under the masks, so they fit; a failure means a bug, and the matcher's error state then
        allows EOS only."""
        self._consume(live)

    def _consume(self, live: list) -> None:
        if not live or self._receives:  # rank 0 advances the matchers; this rank has none
            return
        accepted = self._llg_executor().consume_token_par(live)
        if not all(accepted):
            self.num_rejected += _log_rejected(live, accepted)

    def _llg_executor(self):
        return self._grammar_worker().executor

    def _grammar_worker(self) -> GrammarWorker:
        if self._worker is None:
            threads = os.environ.get("AIOINFER_GRAMMAR_THREADS")
            self._worker = GrammarWorker(int(threads) if threads else default_grammar_threads(self._cpus),
                                         self._cpus, HANDOFF)
        return self._worker

    def close(self) -> None:
        """End the worker thread and free the slots' events (idempotent; a dropped GrammarMasks ends the
        thread too)."""
        if self._worker is not None:
            self._worker.close()
            self._worker = None
        if self._slots is not None:
            self._slots.close()
            self._slots = None

    def fill(self, states: Sequence[SamplingRow], drafts: Optional[Sequence[list[int]]]) -> Optional[StepMask]:
        """Masks for the rows of requests with a grammar, or None when the step has none."""
        return self.finish_fill(self.plan(states, drafts))

    def plan(self, states: Sequence[SamplingRow], drafts: Optional[Sequence[list[int]]] = None,
             tokens_known: bool = True) -> Optional[PendingMask]:
        """The masks a step needs (which rows, a buffer for them), or None when it has none; computed by
        ``start`` (in the worker) or ``finish_fill`` (here). ``tokens_known=False``: a step launched
        ahead, planned before the tokens of the step before it are collected (and its matchers
        advanced by them: only then may ``start`` run); its buffer is a slot (mask_slots.py)."""
        if drafts is None:  # one row a request: a mask row is its state's row (the common step, kept short)
            last_states, grammar_states, plain, matchers = self._last_plan
            # The same rows as the last such plan (a decode batch, step after step): its lists reused.
            if len(states) != len(last_states) or not all(map(operator.is_, states, last_states)):
                grammar_states = [i for i, state in enumerate(states) if state.grammar is not None]
                matchers = [states[i].grammar for i in grammar_states]
                plain = list(zip(matchers, range(len(matchers))))
                self._last_plan = (states, grammar_states, plain, matchers)
                if grammar_states and not self._eos:
                    self._eos = tuple(states[grammar_states[0]].eos_token_ids)
            if not grammar_states:
                return None
            assert not tokens_known or all(states[i].num_pending_tokens == 0 for i in grammar_states), \
                "a grammar with tokens still on the device"
            pending = PendingMask(None, grammar_states, len(states), grammar_states, plain, [], matchers)
        else:
            plain, with_drafts = [], []  # as llguidance takes them (it refuses an empty draft list)
            rows: list[int] = []
            grammar_states = []
            num_rows = 0
            for i, state in enumerate(states):
                width = 1 + len(drafts[i])
                if state.grammar is not None:
                    # A mask follows every token before it: the engine computes it once they are known.
                    assert not tokens_known or state.num_pending_tokens == 0, "a grammar with tokens still on the device"
                    if drafts[i]:
                        with_drafts.append((state.grammar, len(rows), list(drafts[i])))
                    else:
                        plain.append((state.grammar, len(rows)))
                    rows.extend(range(num_rows, num_rows + width))
                    grammar_states.append(i)
                num_rows += width
            if not rows:
                return None
            pending = PendingMask(None, rows, num_rows, grammar_states, plain, with_drafts,
                                  [states[i].grammar for i in grammar_states])
        if self._receives:  # rank 0 sends the masks: no buffer here
            return pending
        if not tokens_known and drafts is None:
            if self._slots is None:
                self._slots = MaskSlots(self.num_words, self.device, self._max_rows)
            pending.slot = self._slots.take(len(pending.rows))
            pending.host = pending.slot.host[:len(pending.rows)]
        else:
            pending.host = self._host_buffer(len(pending.rows), drafts)
        return pending

    def _host_buffer(self, num_rows: int, drafts) -> torch.Tensor:
        """Where the masks of a step planned with its tokens known are computed (pinned on CUDA)."""
        pinned = self.device.type == "cuda"
        if drafts is None:  # the executor writes every row whole: no need to clear 4.9 MB (256 rows, 151k vocab)
            return torch.empty((num_rows, self.num_words), dtype=torch.int32, pin_memory=pinned)
        # Rows the executor does not reach stay empty, and ``_extend_past_stops`` fills them.
        return torch.zeros((num_rows, self.num_words), dtype=torch.int32, pin_memory=pinned)

    def start(self, pending: Optional[PendingMask], live: Sequence[tuple[object, int]] = ()) -> None:
        """``advance`` by ``live`` (the tokens just collected), then compute ``pending``'s masks, in
        the worker thread while the caller goes on (grammar_worker.py: it only calls llguidance);
        ``poll`` and ``finish_fill`` start their copy to the device once they are computed."""
        if pending is None:
            self.advance(live)
            return
        worker = self._grammar_worker()
        host = pending.host
        if live:
            tokens = getattr(live, "tokens", None) or [token for _, token in live]
            if any(eos in tokens for eos in self._eos):
                self._note_failures(live)
        pending.job = self._job = MaskJob(live, pending.plain, pending.with_drafts, host.data_ptr(),
                                          self.num_words * 4, host.shape[0])
        worker.submit(pending.job)

    def _note_failures(self, live: Sequence[tuple[object, int]]) -> None:
        """Matchers in their error state among those that sampled EOS (theirs was the only token allowed),
        kept for ``failure`` (the matchers are idle now: no job holds them)."""
        eos = self._eos
        for matcher, token in live:
            if token in eos and matcher.is_error():
                if len(self._failed) >= 4096:  # never asked (its request aborted meanwhile): bounded anyway
                    self._failed.pop(next(iter(self._failed)))
                self._failed[id(matcher)] = (matcher, matcher.get_error())

    def failure(self, matcher) -> Optional[str]:
        """Why ``matcher`` could not keep its constraint (llguidance's error), or None: asked by the
        engine's thread for a constrained request that has just ended."""
        noted = self._failed.pop(id(matcher), None)
        if noted is not None and noted[0] is matcher:
            return noted[1]
        if self._receives or (self._job is not None and not self._job.is_done()):
            return None  # the worker holds the matchers; ``start`` looked at them before it did
        return matcher.get_error() if matcher.is_error() else None

    def poll(self, pending: Optional[PendingMask]) -> bool:
        """Start the copy of ``pending``'s masks if the worker has computed them (never waits): the
        engine thread calls this between its host tasks, so that the copy runs while the step's
        forward still computes. True when they are computed (``finish_fill`` would not wait)."""
        if pending is None:
            return True
        job = pending.job
        if job is None:  # not started (finish_fill computes them) or received from rank 0
            return False
        if pending.copied:
            return True
        if not job.is_done():
            return False
        self._take_job(pending)
        if pending.slot is not None:
            self._slots.start_copy(pending.slot, len(pending.rows))
        pending.copied = True
        return True

    def finish_fill(self, pending: Optional[PendingMask]) -> Optional[StepMask]:
        """The masks of ``pending`` on the device (one copy from pinned memory), computed here if no
        worker has started on them; None for None."""
        if pending is None:
            return None
        num_masks = len(pending.rows)
        if self._receives:
            bits = torch.empty((num_masks, self.num_words), dtype=torch.int32, device=self.device)
            self._group.broadcast_tensor(bits)
        else:
            if pending.job is None:
                self._compute(pending)
            elif not pending.copied:
                waited = time.perf_counter()
                pending.job.wait()
                self.wait_seconds += time.perf_counter() - waited
                self._take_job(pending)
            if pending.slot is not None:  # launched ahead (never under tensor parallelism: engine_core.py)
                if not pending.copied:
                    self._slots.start_copy(pending.slot, num_masks)
                    pending.copied = True
                bits = self._slots.apply_rows(pending.slot, num_masks)
            else:  # the CPU, or lockstep (copied on the compute stream, after the forward)
                bits = pending.host.to(self.device, non_blocking=True) if self.device.type == "cuda" else pending.host
            if self._group is not None:
                self._group.broadcast_tensor(bits)
        index = None if num_masks == pending.num_rows else host_to_device(pending.rows, torch.int64, self.device)
        return StepMask(bits, index, pending.grammar_states, pending.matchers)

    def _take_job(self, pending: PendingMask) -> None:
        """The worker is done with ``pending``'s job: its timings counted, its errors raised or logged."""
        job = pending.job
        job.wait()
        if job.rejected is not None:
            self.num_rejected += _log_rejected(job.live, job.rejected)
        if job.with_drafts:
            _extend_past_stops(pending.host, job.with_drafts)
        self.fill_seconds += job.finished - job.started
        self.copy_start_seconds += time.perf_counter() - job.finished
        self.num_fills += 1

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
            _extend_past_stops(host, pending.with_drafts)

    def apply(self, logits: torch.Tensor, mask: StepMask) -> torch.Tensor:
        """Disallowed tokens' logits to -inf, in place ([N, V]; the rows without a grammar unchanged)."""
        return apply_bitmask(logits, mask.bits, mask.rows)


def default_grammar_threads(cpus: Optional[set]) -> int:
    """llguidance's threads unless ``AIOINFER_GRAMMAR_THREADS`` says: half the CPUs (those the process
    may use), at most 4. The masks need only be ready within the step's forward, and more threads
    barely shorten them (256 rows of Qwen2.5's vocabulary on the H200 host: 1.29 ms on 2 threads,
    0.99 on 4, 0.87 on 12) while they take CPU time from the engine thread and the worker, whose
    Python bounds the constrained step: in one engine llguidance's own default (80 % of the cores,
    12 there) gave 0.815 of the free throughput and 4 threads 0.922, ahead in each of 6 rounds
    (2026-12-03, H200)."""
    count = len(cpus) if cpus else (os.cpu_count() or 1)
    return max(1, min(4, count // 2))


class LiveTokens(list):
    """(matcher, token) pairs, with ``tokens`` beside them (``start`` looks for EOS among them in C)."""

    __slots__ = ("tokens",)


def live_tokens(matchers: Sequence, token_ids: Sequence[int], indices: Sequence[int]) -> list:
    """(matcher, token) for the rows at ``indices`` (``matchers`` theirs, in order). A stopped matcher
    (complete, or in error: its mask allows EOS only) takes EOS again and stays as it is (llguidance
    1.9), so none is left out: asking each whether it had stopped, 128 calls into llguidance, cost the
    engine thread ~0.05 ms of a 0.5b constrained step (profiled on the H200, 2026-12-04)."""
    tokens = token_ids if len(indices) == len(token_ids) else [token_ids[i] for i in indices]
    live = LiveTokens(zip(matchers, tokens))
    live.tokens = tokens
    return live


def _extend_past_stops(host: torch.Tensor, with_drafts: Sequence[tuple]) -> None:
    """The rows of a request's drafts that llguidance left unwritten (empty) get the mask of the last
    row it wrote. It stops at a draft the grammar rejects, and then the rows after are discarded by
    verification (that draft is not in the mask before it); but it also stops once the matcher is
    stopped (its grammar complete), after writing that row's EOS-only mask, and then the drafts may
    well be EOS (with ``ignore_eos``, or before a length limit): each row after must allow EOS only
    too, not every token, or the token after the accepted drafts could be anything. A row llguidance
    writes is never empty (a matcher in error allows EOS)."""
    rows = host.numpy()
    for _, first, drafts in with_drafts:
        block = rows[first:first + len(drafts) + 1]
        written = block.any(axis=1)
        if not written.all():
            last = int(written.argmin()) - 1  # rows are written from the first on, up to where it stopped
            if last >= 0:
                block[last + 1:] = block[last]


def _log_rejected(live: Sequence, accepted: Sequence[bool]) -> int:
    """Log each token a matcher rejected; their count. The tokens were sampled under its mask, so this
    is one of llguidance's limits met while consuming it (the request then ends with an error: its
    matcher allows EOS only), or a bug if the error says otherwise."""
    rejected = 0
    for (matcher, token_id), ok in zip(live, accepted):
        if not ok:
            rejected += 1
            logger.warning("structured outputs: the grammar could not take sampled token %d: %s", token_id,
                           matcher.get_error().split("\n", 1)[0])
    return rejected
