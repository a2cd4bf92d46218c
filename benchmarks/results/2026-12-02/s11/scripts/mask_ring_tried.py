"""Where a step's grammar masks wait on their way to the device: a few slots used in turn, each a
pinned host buffer, a device buffer and two events, made once (CUDA only).

A step's masks took a pinned host tensor and a device tensor from torch's caching allocators and
a new event each, and were copied through torch on a side stream: on the H200 host that copy took
the worker about 0.3 ms of Python a step (tenth session, ``copy_start_ms_per_step``), all of it under
the GIL the engine thread needs, and sliced by the engine thread's switch interval. Here the engine
thread takes the next slot when it plans a step; the worker fills the slot's host buffer, then
enqueues one ``cudaMemcpyAsync`` and an event record through cuda-python (a few µs, without torch's
dispatcher); the sampling waits for that event on the compute stream.

Reuse is ordered by events, not by the step loop's order: before a slot's host buffer is written
again its last copy has finished (``copied``, synchronised by the worker: long done in practice),
and its device buffer is not overwritten before the masks read from it were applied (``read``,
recorded on the compute stream after the apply; the copy stream waits for it). Without cuda-python
(an install without the ``cuda`` extra) torch's streams and events do the same, a little slower.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

NUM_SLOTS = 3  # a step's masks are filled while the previous step's are applied: 2 in use, 1 spare
USE_CUDA_PYTHON = True  # where it is installed (tests turn it off to check torch's path)


class MaskSlot:
    """One step's masks: ``host`` (pinned, [rows, words] int32) is filled by the worker, ``copy``
    sends it, ``device_view`` is what the sampling applies once ``read`` is recorded after it."""

    __slots__ = ("_ring", "_host", "_device", "_copied", "_read", "host", "num_rows")

    def __init__(self, ring: "MaskRing") -> None:
        self._ring = ring
        self._host: Optional[torch.Tensor] = None
        self._device: Optional[torch.Tensor] = None
        self._copied = ring._new_event()
        self._read = ring._new_event()
        self.host: Optional[torch.Tensor] = None
        self.num_rows = 0

    def _use(self, num_rows: int) -> None:
        if self._host is None or self._host.shape[0] < num_rows:
            # Larger buffers (rare: the first steps, or more rows than before): the old ones may still
            # be read by a copy or an apply in flight, which raw copies hide from torch's allocators.
            self._ring._synchronize(self._copied)
            self._ring._synchronize(self._read)
            rows = max(num_rows, 2 * self._host.shape[0] if self._host is not None else num_rows)
            shape = (rows, self._ring.num_words)
            with torch.inference_mode(False):  # written by the worker thread, outside inference mode
                self._host = torch.empty(shape, dtype=torch.int32, pin_memory=True)
                self._device = torch.empty(shape, dtype=torch.int32, device=self._ring.device)
        self.host = self._host[:num_rows]
        self.num_rows = num_rows

    def before_fill(self) -> None:
        """The worker, before writing ``host``: the slot's last copy out of it has finished."""
        self._ring._synchronize(self._copied)

    def copy(self) -> None:
        """The worker, once ``host`` is filled: enqueue its copy to the device on the ring's stream,
        behind the last apply that read the device buffer."""
        self._ring._copy(self._host, self._device, self.num_rows, self._copied, self._read)

    def device_view(self, compute: torch.cuda.Stream) -> torch.Tensor:
        """The masks on the device, for work enqueued on ``compute`` from now on (it waits for the copy)."""
        self._ring._wait(compute, self._copied)
        return self._device[: self.num_rows]

    def mark_read(self, compute: torch.cuda.Stream) -> None:
        """After the work on ``compute`` that reads ``device_view`` is enqueued."""
        self._ring._record(self._read, compute)


class MaskRing:
    def __init__(self, num_words: int, device: torch.device, num_slots: int = NUM_SLOTS,
                 cuda_python: Optional[bool] = None) -> None:
        self.num_words = num_words
        self.device = device
        self._rt = None
        if USE_CUDA_PYTHON if cuda_python is None else cuda_python:
            try:
                from cuda.bindings import runtime as cudart  # lazy: CUDA only
            except ImportError:
                pass
            else:
                self._rt = cudart
        self.backend = "torch" if self._rt is None else "cuda-python"
        self._stream = torch.cuda.Stream(device)
        self._slots = [MaskSlot(self) for _ in range(num_slots)]
        self._next = 0

    def take(self, num_rows: int) -> MaskSlot:
        """The next slot, sized for ``num_rows`` rows (the engine thread, planning a step)."""
        slot = self._slots[self._next]
        self._next = (self._next + 1) % len(self._slots)
        slot._use(num_rows)
        return slot

    def close(self) -> None:
        for slot in self._slots:
            self._synchronize(slot._copied)
            self._synchronize(slot._read)
            if self._rt is not None:
                self._rt.cudaEventDestroy(slot._copied)
                self._rt.cudaEventDestroy(slot._read)
        self._slots = []

    # -- the two backends ------------------------------------------------------------------------------
    def _new_event(self) -> Any:
        if self._rt is None:
            return torch.cuda.Event()
        with torch.cuda.device(self.device):  # an event belongs to the current device
            return self._check("cudaEventCreateWithFlags",
                               self._rt.cudaEventCreateWithFlags(self._rt.cudaEventDisableTiming))[0]

    def _copy(self, host: torch.Tensor, device: torch.Tensor, num_rows: int, copied: Any, read: Any) -> None:
        if self._rt is None:
            with torch.cuda.stream(self._stream):
                self._stream.wait_event(read)
                device[:num_rows].copy_(host[:num_rows], non_blocking=True)
                copied.record(self._stream)
            return
        rt, stream = self._rt, self._stream.cuda_stream
        self._check("cudaStreamWaitEvent", rt.cudaStreamWaitEvent(stream, read, 0))
        self._check("cudaMemcpyAsync", rt.cudaMemcpyAsync(device.data_ptr(), host.data_ptr(),
                                                          num_rows * self.num_words * 4,
                                                          rt.cudaMemcpyKind.cudaMemcpyHostToDevice, stream))
        self._check("cudaEventRecord", rt.cudaEventRecord(copied, stream))

    def _wait(self, compute: torch.cuda.Stream, event: Any) -> None:
        if self._rt is None:
            compute.wait_event(event)
        else:
            self._check("cudaStreamWaitEvent", self._rt.cudaStreamWaitEvent(compute.cuda_stream, event, 0))

    def _record(self, event: Any, compute: torch.cuda.Stream) -> None:
        if self._rt is None:
            event.record(compute)
        else:
            self._check("cudaEventRecord", self._rt.cudaEventRecord(event, compute.cuda_stream))

    def _synchronize(self, event: Any) -> None:
        if self._rt is None:
            if not event.query():  # done (or never recorded): no call that gives up the GIL
                event.synchronize()
        else:
            self._check("cudaEventSynchronize", self._rt.cudaEventSynchronize(event))

    def _check(self, name: str, result: tuple) -> tuple:
        err, values = result[0], result[1:]
        if err != self._rt.cudaError_t.cudaSuccess:
            raise RuntimeError(f"{name} failed: {err!r} ({self._rt.cudaGetErrorString(err)[1]})")
        return values
