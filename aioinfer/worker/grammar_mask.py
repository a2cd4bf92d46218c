"""Structured outputs in the step: each constrained row's allowed tokens as a bitmask, applied to the logits.

The model runner calls ``fill`` after it has enqueued the step's forward, so the host computes the
masks (llguidance, in its own threads without the GIL) while the device computes the logits; one
pinned host-to-device copy carries them, and ``apply`` sets every disallowed logit to -inf on the
device before the sampler sees them (so logprobs are those of the masked distribution, as in vLLM).
A request with drafts has one mask per row: the mask after each draft, computed by advancing its
matcher through the drafts and back (llguidance stops at a draft the grammar rejects; the rows
after it are discarded by verification anyway, since that draft is not in the mask before it).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
import torch

from aioinfer.worker.sampling_metadata import SamplingRow, host_to_device


@dataclass(slots=True)
class StepMask:
    bits: torch.Tensor  # [G, W] int32 on the device: bit j of word w allows token 32 w + j
    rows: Optional[torch.Tensor]  # [G] int64 logits rows the masks belong to; None: every row, in order
    grammar_states: list[int]  # indices (in the step's sampled states) of the requests with a grammar


class GrammarMasks:
    def __init__(self, vocab_size: int, device: torch.device) -> None:
        self.vocab_size = vocab_size
        self.num_words = (vocab_size + 31) // 32
        self.device = device
        self._executor = None  # llguidance.LLExecutor, made at first use
        # bit j of a word as an int32 (1 << 31 is the sign bit)
        self._bit_values = torch.from_numpy((np.uint32(1) << np.arange(32, dtype=np.uint32)).view(np.int32)).to(device)
        self.fill_seconds = 0.0  # host time spent filling masks, for benchmarks
        self.num_fills = 0

    def fill(self, states: Sequence[SamplingRow], drafts: Optional[Sequence[list[int]]]) -> Optional[StepMask]:
        """Masks for the rows of requests with a grammar, or None when the step has none."""
        started = time.perf_counter()
        entries = []  # (matcher, its first mask row, its drafts)
        rows: list[int] = []
        grammar_states: list[int] = []
        num_rows = 0
        for i, state in enumerate(states):
            width = 1 + (len(drafts[i]) if drafts is not None else 0)
            if state.grammar is not None:
                # A mask follows every token before it: the engine keeps such steps in lockstep.
                assert state.num_pending_tokens == 0, "a grammar with tokens still on the device"
                entries.append((state.grammar, len(rows), list(drafts[i]) if drafts is not None else []))
                rows.extend(range(num_rows, num_rows + width))
                grammar_states.append(i)
            num_rows += width
        if not entries:
            return None
        if self._executor is None:
            import llguidance

            self._executor = llguidance.LLExecutor()
        pinned = self.device.type == "cuda"
        host = torch.full((len(rows), self.num_words), -1, dtype=torch.int32, pin_memory=pinned)
        # The executor writes row k of the mask at data_ptr + k * row bytes (llguidance.torch's helpers
        # do the same, but importing that module costs seconds: it compiles a kernel with torch.compile).
        plain = [(m, at) for m, at, ds in entries if not ds]
        with_drafts = [entry for entry in entries if entry[2]]  # llguidance refuses an empty draft list
        row_bytes = self.num_words * 4
        if plain:
            self._executor.unsafe_compute_mask_ptr(plain, host.data_ptr(), row_bytes, len(rows))
        if with_drafts:
            self._executor.unsafe_compute_mask_ptr_with_draft_token(with_drafts, host.data_ptr(), row_bytes, len(rows))
        bits = host.to(self.device, non_blocking=True) if pinned else host
        index = None if len(rows) == num_rows else host_to_device(rows, torch.int64, self.device)
        self.fill_seconds += time.perf_counter() - started
        self.num_fills += 1
        return StepMask(bits, index, grammar_states)

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
