"""Where the masks of steps launched ahead live: two slots, each pinned host rows, device rows and a
copy event, made once and taken in turn (grammar_mask.py ``plan``).

The grammar worker writes a step's masks into its slot's host rows once the step before it is
collected; the engine copies them to the slot's device rows on a stream of its own while the forward
computes (started by its polls), and the compute stream waits for that copy before the apply reads
them. With cuda-python the copy, its event and the compute stream's wait are one driver call each.
The apply reading the pinned host rows itself over the bus (no copy, event or stream wait; the
form landed on 2026-12-04) is gone: the device paid for it (the apply took 0.10-0.11 ms
reading host rows against 0.02-0.07 ms reading device rows, plus a 0.05 ms copy that overlaps the
forward; H200, 128 rows of Qwen2.5's vocabulary), the engine thread paid about the same either way
(a launch alone 19-24 µs of its CPU; the copy's three driver calls about 30 µs), and in one engine
it gave 0.781 and 0.874 of the free throughput against the copy's 0.886 and 0.857 on two slow hosts
and 0.874 against 0.880 on a faster one (H200 hosts, 2026-12-04).

Two slots are enough, with nothing to wait for on the host: the engine collects every step (its
sampled ids synced on) before it launches the step after the next one, and a slot is written only
after the step that takes it is launched. The step that used the slot before (two slot-taking
launches back) has then been collected, so its copy (which read the host rows) and its apply (which
read the device rows, on the compute stream before its sampling) are done. The device rows are made
on the copy stream, which writes them: a block of the compute stream's pool could be one its queued
kernels still use (a ring of such buffers lost 71 tokens to that on 7b, H200, 2026-12-03).

Made once because a fresh pinned buffer, device buffer and event a step, under a stream context,
cost the engine thread about 40 µs a constrained step in a hot loop and several times that in the
step (H200, 2026-12-03: the engine-side path with no grammar work went from 0.86 of the free
throughput to 0.87-0.98).
Slots grow (to twice the rows, or the rows needed) when a step has more rows than they hold; the
old ones are kept until ``close``, since a step in flight may still read them.

On the CPU the host rows are the rows the apply reads: no copy, no event.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch


@dataclass(slots=True)
class MaskSlot:
    """One slot: what a step's masks are written to, copied to and read from (its own buffers, so a
    step that took it before the slots grew still copies and reads what the worker wrote)."""

    index: int  # 0 or 1: taken in turn
    host: torch.Tensor  # [rows, W] int32, pinned on CUDA
    device: torch.Tensor  # [rows, W] int32: the rows the apply reads (on the CPU, the host rows themselves)
    event: Any  # the copy's event (cuda-python or torch); None on the CPU, where nothing is copied


class MaskSlots:
    def __init__(self, num_words: int, device: torch.device, rows: int) -> None:
        self.num_words = num_words
        self.device = device
        self._on_cuda = device.type == "cuda"
        self._next = 0
        self._retired: list = []  # slots outgrown while a step in flight may still read them
        self._copy_stream: Optional[torch.cuda.Stream] = None
        self._rt = None  # cuda.bindings.runtime, when installed
        if self._on_cuda:
            try:
                from cuda.bindings import runtime as cudart  # lazy: never imported on the CPU path
            except ImportError:
                cudart = None
            self._rt = cudart
            self._copy_stream = torch.cuda.Stream(device)
        self._make(max(rows, 1))

    @property
    def rows(self) -> int:
        return self._slots[0].host.shape[0]

    def _make(self, rows: int) -> None:
        self._slots = [self._slot(index, rows) for index in range(2)]

    def _slot(self, index: int, rows: int) -> MaskSlot:
        host = torch.empty((rows, self.num_words), dtype=torch.int32, pin_memory=self._on_cuda)
        if not self._on_cuda:
            return MaskSlot(index, host, host, None)
        with torch.cuda.stream(self._copy_stream):  # blocks of the stream that writes them
            device = torch.empty((rows, self.num_words), dtype=torch.int32, device=self.device)
        if self._rt is None:
            event = torch.cuda.Event()
        else:
            with torch.cuda.device(self.device):  # an event belongs to the thread's current device
                event = self._check(self._rt.cudaEventCreateWithFlags(self._rt.cudaEventDisableTiming))[0]
        return MaskSlot(index, host, device, event)

    def take(self, num_rows: int) -> MaskSlot:
        """The next slot (the worker writes a step's ``num_rows`` masks into its first host rows)."""
        if num_rows > self.rows:
            self._retired.extend(self._slots)
            self._make(max(num_rows, 2 * self.rows))
        slot = self._slots[self._next]
        self._next ^= 1
        return slot

    def start_copy(self, slot: MaskSlot, num_rows: int) -> None:
        """Start the host-to-device copy of the slot's first ``num_rows`` rows on the copy stream (on
        CUDA; the CPU has nothing to copy)."""
        if slot.event is None:
            return
        if self._rt is None:
            with torch.cuda.stream(self._copy_stream):
                slot.device[:num_rows].copy_(slot.host[:num_rows], non_blocking=True)
                slot.event.record(self._copy_stream)
            return
        rt, stream = self._rt, self._copy_stream.cuda_stream
        self._check(rt.cudaMemcpyAsync(slot.device.data_ptr(), slot.host.data_ptr(), num_rows * self.num_words * 4,
                                       rt.cudaMemcpyKind.cudaMemcpyHostToDevice, stream))
        self._check(rt.cudaEventRecord(slot.event, stream))

    def apply_rows(self, slot: MaskSlot, num_rows: int) -> torch.Tensor:
        """The first ``num_rows`` of the rows the apply reads: their device copy once the compute stream
        has waited for it (``start_copy`` was called), or on the CPU the host rows themselves."""
        if slot.event is not None:
            compute = torch.cuda.current_stream(self.device)
            if self._rt is None:
                compute.wait_event(slot.event)
            else:
                self._check(self._rt.cudaStreamWaitEvent(compute.cuda_stream, slot.event, 0))
        return slot.device[:num_rows]

    def close(self) -> None:
        """Destroy the driver events (idempotent; a copy still in flight keeps its own reference); the
        buffers go with the object."""
        if self._rt is None:
            return
        for slot in self._slots + self._retired:
            if slot.event is not None:
                self._rt.cudaEventDestroy(slot.event)
        self._rt, self._retired = None, []

    def _check(self, result: tuple) -> tuple:
        """A cuda-python call's values without its error code; raises on an error."""
        if result[0] != self._rt.cudaError_t.cudaSuccess:
            raise RuntimeError(f"CUDA error in the structured-output masks' copy: {result[0]!r}")
        return result[1:]
