"""Where the masks of steps launched ahead live: two slots, each pinned host rows, device rows and a
copy event, made once and taken in turn (grammar_mask.py ``plan``).

The grammar worker writes a step's masks into its slot's host rows once the step before it is
collected; the engine copies them to the slot's device rows on a stream of its own, while the
forward computes, and the compute stream waits for that copy before the apply reads them.

Two slots are enough, with nothing to wait for on the host: the engine collects every step (its
sampled ids synced on) before it launches the step after the next one, and a slot is written only
after the step that takes it is launched. The step that used the slot before (two slot-taking
launches back) has then been collected, so its copy (which read the host rows) and its apply (which
read the device rows, on the compute stream before its sampling) are done. The device rows are
made on the copy stream, which writes them: a block of the compute stream's pool could be one its
queued kernels still use (the thirteenth session's ring lost 71 tokens to that on 7b).

Made once because a fresh pinned buffer, device buffer and event a step, under a stream context,
cost the engine thread about 40 µs a constrained step in a hot loop and several times that in the
step (the fifteenth session: the engine-side path with no grammar work went from 0.86 of the free
throughput to 0.87-0.98, docs/performance.md).
Slots grow (to twice the rows, or the rows needed) when a step has more rows than they hold; the
old ones are kept until ``close``, since a step in flight may still read them. With cuda-python the
copy, its event and the compute stream's wait are one driver call each.

On the CPU the host rows are the rows the apply reads: no copy, no event.
"""

from __future__ import annotations

from typing import Optional

import torch


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
            self._copy_stream = torch.cuda.Stream(device)
            try:
                from cuda.bindings import runtime as cudart  # lazy: never imported on the CPU path
            except ImportError:
                cudart = None
            self._rt = cudart
        self._make(max(rows, 1))

    @property
    def rows(self) -> int:
        return self._host[0].shape[0]

    def _make(self, rows: int) -> None:
        pinned = self._on_cuda
        self._host = [torch.empty((rows, self.num_words), dtype=torch.int32, pin_memory=pinned) for _ in range(2)]
        if not self._on_cuda:
            self._device, self._events = self._host, [None, None]
            return
        with torch.cuda.stream(self._copy_stream):  # blocks of the stream that writes them
            self._device = [torch.empty((rows, self.num_words), dtype=torch.int32, device=self.device)
                            for _ in range(2)]
        if self._rt is None:
            self._events = [torch.cuda.Event(), torch.cuda.Event()]
        else:
            with torch.cuda.device(self.device):  # an event belongs to the thread's current device
                self._events = [self._check(self._rt.cudaEventCreateWithFlags(self._rt.cudaEventDisableTiming))[0]
                                for _ in range(2)]

    def take(self, num_rows: int) -> tuple[int, torch.Tensor]:
        """The next slot and its first ``num_rows`` host rows (the worker writes the masks there)."""
        if num_rows > self.rows:
            self._retired.append((self._host, self._device, self._events))
            self._make(max(num_rows, 2 * self.rows))
        slot = self._next
        self._next ^= 1
        return slot, self._host[slot][:num_rows]

    def start_copy(self, slot: int, num_rows: int) -> None:
        """Start the host-to-device copy of the slot's first ``num_rows`` rows on the copy stream."""
        if not self._on_cuda:
            return
        host, device = self._host[slot], self._device[slot]
        if self._rt is None:
            with torch.cuda.stream(self._copy_stream):
                device[:num_rows].copy_(host[:num_rows], non_blocking=True)
                self._events[slot].record(self._copy_stream)
            return
        rt, stream = self._rt, self._copy_stream.cuda_stream
        self._check(rt.cudaMemcpyAsync(device.data_ptr(), host.data_ptr(), num_rows * self.num_words * 4,
                                  rt.cudaMemcpyKind.cudaMemcpyHostToDevice, stream))
        self._check(rt.cudaEventRecord(self._events[slot], stream))

    def device_rows(self, slot: int, num_rows: int) -> torch.Tensor:
        """The slot's first ``num_rows`` device rows, once the compute stream has waited for their copy
        (``start_copy`` was called)."""
        if self._on_cuda:
            compute = torch.cuda.current_stream(self.device)
            if self._rt is None:
                compute.wait_event(self._events[slot])
            else:
                self._check(self._rt.cudaStreamWaitEvent(compute.cuda_stream, self._events[slot], 0))
        return self._device[slot][:num_rows]

    def close(self) -> None:
        """Destroy the driver events (idempotent; a copy still in flight keeps its own reference); the
        buffers go with the object."""
        if self._rt is None:
            return
        for events in [self._events] + [retired[2] for retired in self._retired]:
            for event in events:
                self._rt.cudaEventDestroy(event)
        self._rt, self._events, self._retired = None, [None, None], []

    def _check(self, result: tuple) -> tuple:
        """A cuda-python call's values without its error code; raises on an error."""
        if result[0] != self._rt.cudaError_t.cudaSuccess:
            raise RuntimeError(f"CUDA error in the structured-output masks' copy: {result[0]!r}")
        return result[1:]
