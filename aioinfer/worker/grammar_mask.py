"""Structured outputs in the step: each constrained row's allowed tokens as a bitmask, applied to the logits.

The model runner calls ``fill`` after it has enqueued the step's forward, so the host computes the
masks (llguidance, in its own threads without the GIL) while the device computes the logits. Under
async scheduling a step is launched before the previous step's tokens are on the host: its forward
is enqueued at once, and once those tokens are collected a worker thread advances the matchers by
them and computes the masks (``fill_in_background``) while the engine handles the collected step and
schedules the next; the step is sampled just before the next one is launched. One
pinned host-to-device copy carries the masks, and ``apply`` sets every disallowed logit to -inf on the
device before the sampler sees them (so logprobs are those of the masked distribution, as in vLLM).
A request with drafts has one mask per row: the mask after each draft, computed by advancing its
matcher through the drafts and back (llguidance stops at a draft the grammar rejects; the rows
after it are discarded by verification anyway, since that draft is not in the mask before it).
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from aioinfer.worker.sampling_metadata import SamplingRow, host_to_device

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class StepMask:
    bits: torch.Tensor  # [G, W] int32 on the device: bit j of word w allows token 32 w + j
    rows: Optional[torch.Tensor]  # [G] int64 logits rows the masks belong to; None: every row, in order
    grammar_states: list[int]  # indices (in the step's sampled states) of the requests with a grammar


@dataclass(slots=True)
class PendingMask:
    """Masks being computed into ``host`` (pinned on CUDA); ``future``: the worker thread's job."""

    host: torch.Tensor  # [G, W] int32
    rows: list[int]
    num_rows: int  # the step's sampled rows
    grammar_states: list[int]
    future: Optional[Future] = None


class GrammarMasks:
    def __init__(self, vocab_size: int, device: torch.device) -> None:
        self.vocab_size = vocab_size
        self.num_words = (vocab_size + 31) // 32
        self.device = device
        self._executor = None  # llguidance.LLExecutor, made at first use
        self._thread: Optional[ThreadPoolExecutor] = None  # for fill_in_background, made at first use
        # bit j of a word as an int32 (1 << 31 is the sign bit)
        self._bit_values = torch.from_numpy((np.uint32(1) << np.arange(32, dtype=np.uint32)).view(np.int32)).to(device)
        self.fill_seconds = 0.0  # host time spent filling masks, for benchmarks
        self.num_fills = 0

    def advance(self, rows: Sequence[tuple[SamplingRow, int]]) -> None:
        """Each row's matcher takes its one new token, in llguidance's threads (one call for the batch,
        without the GIL: 256 matchers one by one held the GIL about 0.5 ms a step). A stopped matcher
        (complete: only EOS was allowed, and taken unless ignore_eos) takes none. The tokens were
        sampled under the masks, so they fit; a failure means a bug, and the matcher's error state
        then allows EOS only."""
        live = [(state.grammar, token_id) for state, token_id in rows if not state.grammar.is_stopped()]
        if not live:
            return
        for (matcher, token_id), accepted in zip(live, self._llg_executor().consume_token_par(live)):
            if not accepted:
                logger.error("structured outputs: the grammar rejected sampled token %d: %s", token_id,
                             matcher.get_error())

    def _llg_executor(self):
        if self._executor is None:
            import llguidance

            self._executor = llguidance.LLExecutor()
        return self._executor

    def fill(self, states: Sequence[SamplingRow], drafts: Optional[Sequence[list[int]]]) -> Optional[StepMask]:
        """Masks for the rows of requests with a grammar, or None when the step has none."""
        pending = self._start(states, drafts, background=False)
        return self.finish_fill(pending)

    def fill_in_background(self, states: Sequence[SamplingRow], before: Callable[[], None]) -> Optional["PendingMask"]:
        """``fill`` for a step without drafts, computed in a worker thread (llguidance releases the GIL)
        while the caller goes on, after ``before`` (which advances the matchers by the tokens of the
        step just collected); ``finish_fill`` waits for both. None (``before`` run here) when the
        step has no grammar."""
        pending = self._start(states, None, background=True, before=before)
        if pending is None:
            before()
        return pending

    def finish_fill(self, pending: Optional["PendingMask"]) -> Optional[StepMask]:
        """The masks of ``pending`` on the device (one copy from pinned memory); None for None."""
        if pending is None:
            return None
        if pending.future is not None:
            pending.future.result()
        pinned = self.device.type == "cuda"
        bits = pending.host.to(self.device, non_blocking=True) if pinned else pending.host
        index = None if len(pending.rows) == pending.num_rows else host_to_device(pending.rows, torch.int64, self.device)
        return StepMask(bits, index, pending.grammar_states)

    def _start(self, states, drafts, background: bool, before: Optional[Callable[[], None]] = None
               ) -> Optional["PendingMask"]:
        entries = []  # (matcher, its first mask row, its drafts)
        rows: list[int] = []
        grammar_states: list[int] = []
        num_rows = 0
        for i, state in enumerate(states):
            width = 1 + (len(drafts[i]) if drafts is not None else 0)
            if state.grammar is not None:
                # A mask follows every token before it: the engine computes it once they are known.
                assert state.num_pending_tokens == 0, "a grammar with tokens still on the device"
                entries.append((state.grammar, len(rows), list(drafts[i]) if drafts is not None else []))
                rows.extend(range(num_rows, num_rows + width))
                grammar_states.append(i)
            num_rows += width
        if not entries:
            return None
        self._llg_executor()
        pinned = self.device.type == "cuda"
        if drafts is None:  # the executor writes every row whole: no need to clear 4.9 MB (256 rows, 151k vocab)
            host = torch.empty((len(rows), self.num_words), dtype=torch.int32, pin_memory=pinned)
        else:  # rows after a draft the grammar rejects are left as they are: all allowed (and discarded)
            host = torch.full((len(rows), self.num_words), -1, dtype=torch.int32, pin_memory=pinned)
        pending = PendingMask(host, rows, num_rows, grammar_states)
        if background:
            if self._thread is None:
                self._thread = ThreadPoolExecutor(1, thread_name_prefix="aioinfer-grammar")
            pending.future = self._thread.submit(self._compute, host, entries, before)
        else:
            self._compute(host, entries)
        return pending

    def _compute(self, host: torch.Tensor, entries: list, before: Optional[Callable[[], None]] = None) -> None:
        started = time.perf_counter()
        if before is not None:
            before()
        # The executor writes row k of the mask at data_ptr + k * row bytes (llguidance.torch's helpers
        # do the same, but importing that module costs seconds: it compiles a kernel with torch.compile).
        plain = [(m, at) for m, at, ds in entries if not ds]
        with_drafts = [entry for entry in entries if entry[2]]  # llguidance refuses an empty draft list
        row_bytes, num_rows = self.num_words * 4, host.shape[0]
        if plain:
            self._executor.unsafe_compute_mask_ptr(plain, host.data_ptr(), row_bytes, num_rows)
        if with_drafts:
            self._executor.unsafe_compute_mask_ptr_with_draft_token(with_drafts, host.data_ptr(), row_bytes, num_rows)
        self.fill_seconds += time.perf_counter() - started
        self.num_fills += 1

    def apply(self, logits: torch.Tensor, mask: StepMask) -> torch.Tensor:
        """Disallowed tokens' logits to -inf, in place ([N, V]; the rows without a grammar unchanged)."""
        vocab = logits.shape[1]
        if mask.bits.device.type == "cpu":
            # NumPy unpacks bits in C (little-endian words: byte order is bit order), ~5x the torch ops.
            unpacked = np.unpackbits(mask.bits.numpy().view(np.uint8), axis=1, bitorder="little")[:, :vocab]
            allowed = torch.from_numpy(unpacked).view(torch.bool)  # [G, V]
        else:
            allowed = (mask.bits.unsqueeze(-1) & self._bit_values) != 0  # [G, W, 32]
            allowed = allowed.view(allowed.shape[0], -1)[:, :vocab]  # [G, V]
        if mask.rows is None:
            logits.masked_fill_(~allowed, float("-inf"))
        else:
            logits[mask.rows] = logits[mask.rows].masked_fill(~allowed, float("-inf"))
        return logits
