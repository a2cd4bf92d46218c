"""Structured outputs in the step: each constrained row's allowed tokens as a bitmask, applied to the logits.

In lockstep the model runner calls ``fill`` after it has enqueued the step's forward, so the host
computes the masks (llguidance, in its own threads without the GIL) while the device computes the
logits. Under async scheduling a step is launched before the previous step's tokens are on the host:
its forward is enqueued at once and its masks planned (``plan``); once those tokens are collected the
matchers take them (``advance``) and a worker thread computes the masks (``start``) while the engine
handles the collected step, schedules the next and prepares its inputs; the step is sampled
(``finish_fill``, ``apply``) just before the next one is launched. One pinned host-to-device copy
carries the masks, and ``apply`` sets every disallowed logit to -inf on the device before the sampler
sees them (so logprobs are those of the masked distribution, as in vLLM). A request with drafts has
one mask per row: the mask after each draft, computed by advancing its matcher through the drafts
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
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from aioinfer.worker.bitmask_apply import apply_bitmask
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
    the tokens before them are known; ``future``: the worker thread's job, once started."""

    host: Optional[torch.Tensor]  # [G, W] int32; None on a rank that receives the masks
    rows: list[int]
    num_rows: int  # the step's sampled rows
    grammar_states: list[int]
    plain: list  # (matcher, its mask row) of the requests without drafts
    with_drafts: list  # (matcher, its first mask row, its drafts) of those with drafts
    future: Optional[Future] = None


class GrammarMasks:
    def __init__(self, vocab_size: int, device: torch.device) -> None:
        self.vocab_size = vocab_size
        self.num_words = (vocab_size + 31) // 32
        self.device = device
        self._executor = None  # llguidance.LLExecutor, made at first use
        self._thread: Optional[ThreadPoolExecutor] = None  # for ``start``, made at first use
        self._group = None  # tensor parallelism (``share_over``): rank 0 sends the masks, the others receive
        self.fill_seconds = 0.0  # host time spent filling masks, for benchmarks
        self.num_fills = 0

    def share_over(self, group) -> None:
        """Tensor parallelism: every step's masks go from rank 0 to the group's other ranks."""
        self._group = group if group.is_parallel else None

    @property
    def _receives(self) -> bool:
        return self._group is not None and self._group.rank > 0

    def advance(self, rows: Sequence[tuple[SamplingRow, int]]) -> None:
        """Each row's matcher takes its one new token, in llguidance's threads (one call for the batch,
        without the GIL: 256 matchers one by one held the GIL about 0.5 ms a step). A stopped matcher
        (complete: only EOS was allowed, and taken unless ignore_eos) takes none. The tokens were
        sampled under the masks, so they fit; a failure means a bug, and the matcher's error state
        then allows EOS only."""
        self._consume(_live(rows))

    def _consume(self, live: list) -> None:
        if not live:
            return
        for (matcher, token_id), accepted in zip(live, self._llg_executor().consume_token_par(live)):
            if not accepted:
                logger.error("structured outputs: the grammar rejected sampled token %d: %s", token_id,
                             matcher.get_error())

    def _llg_executor(self):
        if self._executor is None:
            import llguidance

            threads = os.environ.get("AIOINFER_GRAMMAR_THREADS")
            self._executor = llguidance.LLExecutor(int(threads) if threads else None)
        return self._executor

    def fill(self, states: Sequence[SamplingRow], drafts: Optional[Sequence[list[int]]]) -> Optional[StepMask]:
        """Masks for the rows of requests with a grammar, or None when the step has none."""
        return self.finish_fill(self.plan(states, drafts))

    def plan(self, states: Sequence[SamplingRow], drafts: Optional[Sequence[list[int]]] = None,
             tokens_known: bool = True) -> Optional[PendingMask]:
        """The masks a step needs (which rows, a buffer for them), or None when it has none; computed by
        ``start`` (in the worker) or ``finish_fill`` (here). ``tokens_known=False``: a step launched
        ahead, planned before the tokens of the step before it are collected (and its matchers
        advanced by them: only then may ``start`` run)."""
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
        pinned = self.device.type == "cuda"
        if self._receives:
            host = None
        elif drafts is None:  # the executor writes every row whole: no need to clear 4.9 MB (256 rows, 151k vocab)
            host = torch.empty((len(rows), self.num_words), dtype=torch.int32, pin_memory=pinned)
        else:  # rows after a draft the grammar rejects are left as they are: all allowed (and discarded)
            host = torch.full((len(rows), self.num_words), -1, dtype=torch.int32, pin_memory=pinned)
        return PendingMask(host, rows, num_rows, grammar_states, plain, with_drafts)

    def start(self, pending: Optional[PendingMask], advances: Sequence[tuple[SamplingRow, int]] = ()) -> None:
        """``advance`` by ``advances`` (the tokens just collected), then compute ``pending``'s masks,
        in the worker thread while the caller goes on (llguidance works in its own threads, without
        the GIL). Returns once the worker is inside llguidance: a thread that merely wakes up needs
        the GIL first, which the engine thread, busy in Python, gives up only at its next blocking
        call or after the interpreter's switch interval (5 ms)."""
        if pending is None:
            self.advance(advances)
            return
        self._llg_executor()
        if self._thread is None:
            self._thread = ThreadPoolExecutor(1, thread_name_prefix="aioinfer-grammar")
        inside = threading.Event()
        pending.future = self._thread.submit(self._compute, pending, inside, _live(advances))
        inside.wait()

    def finish_fill(self, pending: Optional[PendingMask]) -> Optional[StepMask]:
        """The masks of ``pending`` on the device (one copy from pinned memory), computed here if no
        worker has started on them; None for None."""
        if pending is None:
            return None
        if self._receives:
            bits = torch.empty((len(pending.rows), self.num_words), dtype=torch.int32, device=self.device)
            self._group.broadcast_tensor(bits)
        else:
            if pending.future is None:
                self._llg_executor()
                self._compute(pending)
            else:
                pending.future.result()
            pinned = self.device.type == "cuda"
            bits = pending.host.to(self.device, non_blocking=True) if pinned else pending.host
            if self._group is not None:
                self._group.broadcast_tensor(bits)
        index = None if len(pending.rows) == pending.num_rows else host_to_device(pending.rows, torch.int64, self.device)
        return StepMask(bits, index, pending.grammar_states)

    def _compute(self, pending: PendingMask, inside: Optional[threading.Event] = None, live: Sequence = ()) -> None:
        started = time.perf_counter()
        # The executor writes row k of the mask at data_ptr + k * row bytes (llguidance.torch's helpers
        # do the same, but importing that module costs seconds: it compiles a kernel with torch.compile).
        host = pending.host
        row_bytes, num_rows = self.num_words * 4, host.shape[0]
        try:
            if inside is not None:
                # Set just before the calls that release the GIL: the waiting caller takes it back then.
                inside.set()
            self._consume(live)
            if pending.plain:
                self._executor.unsafe_compute_mask_ptr(pending.plain, host.data_ptr(), row_bytes, num_rows)
            if pending.with_drafts:
                self._executor.unsafe_compute_mask_ptr_with_draft_token(pending.with_drafts, host.data_ptr(),
                                                                        row_bytes, num_rows)
        finally:
            if inside is not None:  # (an error before the calls: the caller must not wait forever)
                inside.set()
        self.fill_seconds += time.perf_counter() - started
        self.num_fills += 1

    def apply(self, logits: torch.Tensor, mask: StepMask) -> torch.Tensor:
        """Disallowed tokens' logits to -inf, in place ([N, V]; the rows without a grammar unchanged)."""
        return apply_bitmask(logits, mask.bits, mask.rows)


def _live(rows: Sequence[tuple[SamplingRow, int]]) -> list:
    """(matcher, token) for the rows whose matcher is not stopped."""
    return [(state.grammar, token_id) for state, token_id in rows if not state.grammar.is_stopped()]
