"""Persistent step-input buffers: host staging filled with NumPy, two async copies per step.

Every per-step integer array is packed into one of two staging buffers (int64 and int32) at
offsets decided per step, so the host issues two host-to-device copies, not seven; the index of
the step's placeholder inputs (tokens the previous launch sampled, not yet on the host) travels in
the same copy. On CUDA the staging is pinned and double-buffered: step N+1 fills the other half
while step N's copies may still be in flight, and an event guards each half before it is refilled.
On CPU the "device" buffers are the staging buffers themselves (no copy at all).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from aioinfer.attention.metadata import AttentionMetadata
from aioinfer.core.scheduler import PLACEHOLDER_TOKEN
from aioinfer.core.scheduler_output import ScheduledRequest

_ALIGN = 16  # elements: every packed array starts 64/128-byte aligned


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


@dataclass(slots=True)
class StepInputs:
    input_ids: torch.Tensor  # [num_tokens] int64
    positions: torch.Tensor  # [num_tokens] int64
    attention: AttentionMetadata
    logits_indices: torch.Tensor  # [num_sampled] int64: the last token of each sampling request
    sampled_request_ids: list[str]  # aligned with logits_indices
    is_decode_only: bool  # every scheduled request computes exactly one token
    # Placeholder inputs, filled on the device from the previous launch's sampled ids: either the
    # first ``placeholder_prefix`` tokens take rows 0.. of them in order (a decode batch that kept
    # its order: one copy), or ``placeholder_index`` [2, P] lists (token position, sampled row).
    placeholder_prefix: int = 0
    placeholder_index: Optional[torch.Tensor] = None
    # Speculative decoding: per sampling request (aligned with sampled_request_ids) its drafts, [] for
    # none; logits_indices then holds len(drafts) + 1 rows per request. None: no drafts this step.
    draft_token_ids: Optional[list[list[int]]] = None


class _Staging:
    """One pair of host buffers (pinned on CUDA) and their NumPy views."""

    def __init__(self, size64: int, size32: int, pin: bool) -> None:
        self.int64 = torch.zeros(size64, dtype=torch.int64, pin_memory=pin)
        self.int32 = torch.zeros(size32, dtype=torch.int32, pin_memory=pin)
        self.np64, self.np32 = self.int64.numpy(), self.int32.numpy()
        self.copied = torch.cuda.Event() if pin else None  # the H2D copies out of this pair are done


class _BlockTableRows:
    """Every live request's block table as a row of one persistent NumPy array, kept up to date by
    writing only what changed: a step then gathers its rows in one indexing operation.

    A request's table is the KV manager's own list, which only ever grows while the request holds
    its blocks (a preempted or swapped request, or one whose rejected drafts' blocks were trimmed,
    gets a new list): the list's identity and length tell
    whether a row is current, so a decode step writes a request's row once every ``block_size``
    tokens instead of flattening every table (~32k ints at 256 sequences x 2k tokens) every step.
    """

    def __init__(self, num_rows: int, max_blocks: int) -> None:
        self.table = np.zeros((max(num_rows, 1), max_blocks), dtype=np.int32)
        self._rows: dict[str, int] = {}  # request id -> its row
        self._known: list = [None] * self.table.shape[0]  # per row: (the table list it mirrors, its length)
        self._free = list(range(self.table.shape[0] - 1, -1, -1))

    def rows_for(self, scheduled: list[ScheduledRequest]) -> list[int]:
        rows, known, table = [], self._known, self.table
        for item in scheduled:
            row = self._rows.get(item.request_id)
            if row is None:
                row = self._rows[item.request_id] = self._take_row()
                known, table = self._known, self.table  # the array may have grown
            ids = item.block_ids
            mirrored = known[row]
            if mirrored is None or mirrored[0] is not ids:
                table[row, :len(ids)] = ids
                table[row, len(ids):] = 0
                known[row] = (ids, len(ids))
            elif mirrored[1] != len(ids):  # grown since: write the new blocks only
                table[row, mirrored[1]:len(ids)] = ids[mirrored[1]:]
                known[row] = (ids, len(ids))
            rows.append(row)
        return rows

    def forget(self, request_ids) -> None:
        for request_id in request_ids:
            row = self._rows.pop(request_id, None)
            if row is not None:
                self._known[row] = None
                self._free.append(row)

    def _take_row(self) -> int:
        if not self._free:  # more live requests than rows (preempted ones keep theirs): double
            old = self.table.shape[0]
            self.table = np.concatenate([self.table, np.zeros_like(self.table)])
            self._known += [None] * old
            self._free = list(range(2 * old - 1, old - 1, -1))
        return self._free.pop()


class InputBuffers:
    def __init__(self, max_num_tokens: int, max_num_seqs: int, max_blocks_per_seq: int, block_size: int,
                 device: torch.device) -> None:
        self.block_size = block_size
        self.device = device
        self.max_blocks_per_seq = max_blocks_per_seq
        # int64: input_ids, positions, slot_mapping [tokens each], logits_indices [at most one per
        # token, with drafts], placeholder positions and rows [tokens each]
        size64 = 6 * _aligned(max_num_tokens) + _aligned(max_num_seqs)
        # int32: query_start_loc [seqs + 1], seq_lens [seqs], block_tables [seqs * blocks]
        size32 = _aligned(max_num_seqs + 1) + _aligned(max_num_seqs) + max_num_seqs * max_blocks_per_seq
        self._block_rows = _BlockTableRows(max_num_seqs, max_blocks_per_seq)
        self._on_cuda = device.type == "cuda"
        self._staging = [_Staging(size64, size32, pin=self._on_cuda) for _ in range(2 if self._on_cuda else 1)]
        self._next = 0
        if self._on_cuda:
            self._device64 = torch.zeros(size64, dtype=torch.int64, device=device)
            self._device32 = torch.zeros(size32, dtype=torch.int32, device=device)
        else:
            self._device64, self._device32 = self._staging[0].int64, self._staging[0].int32

    def forget(self, request_ids) -> None:
        """Requests that finished: their block-table rows are free again."""
        self._block_rows.forget(request_ids)

    def prepare(self, scheduled: list[ScheduledRequest], sampled_rows: Optional[dict[str, int]] = None,
                num_draft_tokens: int = 0) -> StepInputs:
        """``sampled_rows``: request id -> its row among the previous launch's sampled ids, for the
        requests whose input is a placeholder (async scheduling). ``num_draft_tokens``: the step's
        draft tokens in all (speculative decoding; 0: none, the usual one row per sampling request)."""
        staging = self._staging[self._next]
        self._next = (self._next + 1) % len(self._staging)
        if staging.copied is not None:
            staging.copied.synchronize()  # its previous copies finished long ago; this rarely waits
        bs = self.block_size
        num_seqs = len(scheduled)
        # Per-sequence scalars as Python lists first (cheap), then a handful of vectorised NumPy ops:
        # per-row NumPy calls would cost ~10 us each, milliseconds per step at 256 sequences.
        counts = [len(item.token_ids) for item in scheduled]
        starts = [item.start_position for item in scheduled]
        seq_lens = [s + c for s, c in zip(starts, counts)]
        query_start_loc = [0]
        for c in counts:
            query_start_loc.append(query_start_loc[-1] + c)
        num_tokens = query_start_loc[-1]
        max_blocks = max(len(item.block_ids) for item in scheduled)
        sampled_ids = [item.request_id for item in scheduled if item.samples]
        drafts = None
        if num_draft_tokens:
            # Speculative decoding: a request with d drafts is sampled at its last d + 1 positions
            # (after the last known token, and after each draft), rows in position order.
            logits_rows, drafts = [], []
            for i, item in enumerate(scheduled):
                if item.samples:
                    end, d = query_start_loc[i + 1], item.num_draft_tokens
                    logits_rows.extend(range(end - 1 - d, end))
                    drafts.append(item.token_ids[len(item.token_ids) - d:] if d else [])
        else:
            logits_rows = [query_start_loc[i + 1] - 1 for i, item in enumerate(scheduled) if item.samples]
        decode_only = num_tokens == num_seqs

        # This step's packing: (buffer, offset, length) per array.
        t = _aligned(num_tokens)
        layout64 = {"input_ids": (0, num_tokens), "positions": (t, num_tokens), "slot_mapping": (2 * t, num_tokens),
                    "logits_indices": (3 * t, len(logits_rows))}
        q = _aligned(num_seqs + 1)
        layout32 = {"query_start_loc": (0, num_seqs + 1), "seq_lens": (q, num_seqs),
                    "block_tables": (q + _aligned(num_seqs), num_seqs * max_blocks)}
        a64 = {name: staging.np64[off:off + n] for name, (off, n) in layout64.items()}
        a32 = {name: staging.np32[off:off + n] for name, (off, n) in layout32.items()}

        tables = a32["block_tables"].reshape(num_seqs, max_blocks)
        table_rows = self._block_rows.rows_for(scheduled)
        np.take(self._block_rows.table[:, :max_blocks], table_rows, axis=0, out=tables)
        if decode_only:  # one token per sequence
            tokens = [item.token_ids[0] for item in scheduled]
            positions = np.asarray(starts, dtype=np.int64)
            rows = np.arange(num_seqs)
        else:
            tokens = [tok for item in scheduled for tok in item.token_ids]
            counts_np = np.asarray(counts)
            rows = np.repeat(np.arange(num_seqs), counts_np)
            offsets = np.arange(num_tokens) - np.repeat(np.asarray(query_start_loc[:-1]), counts_np)
            positions = np.repeat(np.asarray(starts, dtype=np.int64), counts_np) + offsets
        a64["input_ids"][:] = tokens
        placeholder_at, placeholder_rows = _placeholders(tokens, scheduled, rows, decode_only, sampled_rows)
        a64["positions"][:] = positions
        a64["slot_mapping"][:] = tables[rows, positions // bs].astype(np.int64) * bs + positions % bs
        a32["query_start_loc"][:] = query_start_loc
        a32["seq_lens"][:] = seq_lens
        a64["logits_indices"][:] = logits_rows
        used64 = 3 * t + len(logits_rows)
        prefix = 0
        index_at = None
        if placeholder_at:
            num = len(placeholder_at)
            if placeholder_at[-1] == num - 1 and placeholder_rows == placeholder_at:
                prefix = num  # tokens 0..num-1 take sampled rows 0..num-1: the steady decode batch
            else:
                index_at = 3 * t + _aligned(len(logits_rows))
                staging.np64[index_at:index_at + num] = placeholder_at
                staging.np64[index_at + num:index_at + 2 * num] = placeholder_rows
                used64 = index_at + 2 * num
        used32 = layout32["block_tables"][0] + num_seqs * max_blocks
        if self._on_cuda:  # two contiguous pinned -> device copies, truly asynchronous
            self._device64[:used64].copy_(staging.int64[:used64], non_blocking=True)
            self._device32[:used32].copy_(staging.int32[:used32], non_blocking=True)
            staging.copied.record()
            dev64, dev32 = self._device64, self._device32
        else:
            dev64, dev32 = staging.int64, staging.int32
        out = {name: dev64[off:off + n] for name, (off, n) in layout64.items()}
        out.update({name: dev32[off:off + n] for name, (off, n) in layout32.items()})

        attention = AttentionMetadata(
            slot_mapping=out["slot_mapping"],
            query_start_loc=out["query_start_loc"],
            seq_lens=out["seq_lens"],
            block_tables=out["block_tables"].view(num_seqs, max_blocks),
            num_seqs=num_seqs,
            num_tokens=num_tokens,
            max_query_len=max(counts),
            max_seq_len=max(seq_lens),
            query_start_loc_cpu=query_start_loc,
            seq_lens_cpu=seq_lens,
        )
        index = None if index_at is None else dev64[index_at:used64].view(2, len(placeholder_at))
        return StepInputs(input_ids=out["input_ids"], positions=out["positions"], attention=attention,
                          logits_indices=out["logits_indices"], sampled_request_ids=sampled_ids,
                          is_decode_only=decode_only, placeholder_prefix=prefix, placeholder_index=index,
                          draft_token_ids=drafts)


def _placeholders(tokens: list[int], scheduled: list[ScheduledRequest], token_rows, decode_only: bool,
                  sampled_rows: Optional[dict[str, int]]) -> tuple[list[int], list[int]]:
    """(token positions, rows among the previous launch's sampled ids) of the step's placeholder inputs."""
    if not sampled_rows or PLACEHOLDER_TOKEN not in tokens:  # a C-level scan; usually the answer
        return [], []
    at = [i for i, token in enumerate(tokens) if token == PLACEHOLDER_TOKEN]
    if decode_only:
        return at, [sampled_rows[scheduled[i].request_id] for i in at]
    return at, [sampled_rows[scheduled[int(token_rows[i])].request_id] for i in at]
