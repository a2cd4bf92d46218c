"""Persistent step-input buffers: host staging filled with NumPy, one async copy per tensor.

On CUDA the host side is pinned memory, double-buffered: step N+1 fills the other half while
step N's copies may still be in flight, and an event guards each half before it is refilled.
On CPU the "device" tensors are the staging tensors themselves (no copy at all).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from aioinfer.attention.metadata import AttentionMetadata
from aioinfer.core.scheduler_output import ScheduledRequest

_FIELDS = {  # name -> (dtype, shape kind)
    "input_ids": (torch.int64, "tokens"),
    "positions": (torch.int64, "tokens"),
    "slot_mapping": (torch.int64, "tokens"),
    "query_start_loc": (torch.int32, "seqs+1"),
    "seq_lens": (torch.int32, "seqs"),
    "logits_indices": (torch.int64, "seqs"),
    "block_tables": (torch.int32, "table"),  # flat: viewed as [num_seqs, max_blocks of this step]
}


@dataclass(slots=True)
class StepInputs:
    input_ids: torch.Tensor  # [num_tokens] int64
    positions: torch.Tensor  # [num_tokens] int64
    attention: AttentionMetadata
    logits_indices: torch.Tensor  # [num_sampled] int64: the last token of each sampling request
    sampled_request_ids: list[str]  # aligned with logits_indices
    is_decode_only: bool  # every scheduled request computes exactly one token


class _Staging:
    """One set of host tensors (pinned on CUDA) and their NumPy views."""

    def __init__(self, sizes: dict[str, tuple], pin: bool) -> None:
        self.tensors = {name: torch.zeros(sizes[name], dtype=_FIELDS[name][0], pin_memory=pin) for name in _FIELDS}
        self.arrays = {name: t.numpy() for name, t in self.tensors.items()}
        self.copied = torch.cuda.Event() if pin else None  # the H2D copies out of this set are done


class InputBuffers:
    def __init__(self, max_num_tokens: int, max_num_seqs: int, max_blocks_per_seq: int, block_size: int,
                 device: torch.device) -> None:
        self.block_size = block_size
        self.device = device
        self.max_blocks_per_seq = max_blocks_per_seq
        sizes = {"tokens": (max_num_tokens,), "seqs": (max_num_seqs,), "seqs+1": (max_num_seqs + 1,),
                 "table": (max_num_seqs * max_blocks_per_seq,)}
        sizes = {name: sizes[kind] for name, (_, kind) in _FIELDS.items()}
        self._on_cuda = device.type == "cuda"
        self._staging = [_Staging(sizes, pin=self._on_cuda) for _ in range(2 if self._on_cuda else 1)]
        self._next = 0
        if self._on_cuda:
            self.device_tensors = {name: torch.zeros(sizes[name], dtype=_FIELDS[name][0], device=device)
                                   for name in _FIELDS}
        else:
            self.device_tensors = self._staging[0].tensors

    def prepare(self, scheduled: list[ScheduledRequest]) -> StepInputs:
        staging = self._staging[self._next]
        self._next = (self._next + 1) % len(self._staging)
        if staging.copied is not None:
            staging.copied.synchronize()  # its previous copies finished long ago; this rarely waits
        a = staging.arrays
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
        flat_tables: list[int] = []
        for item in scheduled:
            flat_tables += item.block_ids
            flat_tables += [0] * (max_blocks - len(item.block_ids))
        tables = a["block_tables"][:num_seqs * max_blocks].reshape(num_seqs, max_blocks)
        tables.reshape(-1)[:] = flat_tables

        if num_tokens == num_seqs:  # decode-only step: one token per sequence
            a["input_ids"][:num_tokens] = [item.token_ids[0] for item in scheduled]
            positions = np.asarray(starts, dtype=np.int64)
            rows = np.arange(num_seqs)
        else:
            a["input_ids"][:num_tokens] = [t for item in scheduled for t in item.token_ids]
            counts_np = np.asarray(counts)
            rows = np.repeat(np.arange(num_seqs), counts_np)
            offsets = np.arange(num_tokens) - np.repeat(np.asarray(query_start_loc[:-1]), counts_np)
            positions = np.repeat(np.asarray(starts, dtype=np.int64), counts_np) + offsets
        a["positions"][:num_tokens] = positions
        a["slot_mapping"][:num_tokens] = tables[rows, positions // bs].astype(np.int64) * bs + positions % bs
        a["query_start_loc"][:num_seqs + 1] = query_start_loc
        a["seq_lens"][:num_seqs] = seq_lens
        logits_rows = [query_start_loc[i + 1] - 1 for i, item in enumerate(scheduled) if item.samples]
        sampled_ids = [item.request_id for item in scheduled if item.samples]
        a["logits_indices"][:len(logits_rows)] = logits_rows
        decode_only = num_tokens == num_seqs

        extents = {"input_ids": num_tokens, "positions": num_tokens, "slot_mapping": num_tokens,
                   "query_start_loc": num_seqs + 1, "seq_lens": num_seqs, "logits_indices": len(logits_rows),
                   "block_tables": num_seqs * max_blocks}
        out = {}
        for name, extent in extents.items():
            dst = self.device_tensors[name][:extent]
            if self._on_cuda:  # contiguous pinned -> device: a true async copy
                dst.copy_(staging.tensors[name][:extent], non_blocking=True)
            out[name] = dst
        out["block_tables"] = out["block_tables"].view(num_seqs, max_blocks)
        if staging.copied is not None:
            staging.copied.record()

        attention = AttentionMetadata(
            slot_mapping=out["slot_mapping"],
            query_start_loc=out["query_start_loc"],
            seq_lens=out["seq_lens"],
            block_tables=out["block_tables"],
            num_seqs=num_seqs,
            num_tokens=num_tokens,
            max_query_len=max(counts),
            max_seq_len=max(seq_lens),
            query_start_loc_cpu=query_start_loc,
            seq_lens_cpu=seq_lens,
        )
        return StepInputs(input_ids=out["input_ids"], positions=out["positions"], attention=attention,
                          logits_indices=out["logits_indices"], sampled_request_ids=sampled_ids,
                          is_decode_only=decode_only)
