"""Timing of asynchronous copies on one CUDA stream, polled without blocking.

The design card asks for cuda-python (``cuda.bindings``) events: an event pair is recorded around
each copy on the copy stream, and completion is checked later with ``cudaEventQuery``, which never
waits, so timing a swap costs the step loop no host sync. ``cuda.bindings`` is imported here only,
and only when a CUDA timer is built: CPU installs (CI) never import it. Where it is missing (an
install without the ``cuda`` extra), torch's own CUDA events time the copies instead, with a warning,
so that swapping still works; ``backend`` says which one is in use.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

logger = logging.getLogger(__name__)


class CudaCopyTimer:
    """Records timing events on a stream; ``done`` / ``elapsed_s`` read them back later.

    Events are recycled through a free list: creating one per copy would be a driver call per swap.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._free: list[Any] = []
        self._all: list[Any] = []
        try:
            from cuda.bindings import runtime as cudart  # lazy: never imported on the CPU path
        except ImportError:
            logger.warning("cuda-python (cuda.bindings) is not installed: KV swaps are timed with torch's CUDA "
                           "events instead (pip install 'aioinfer[cuda]')")
            self._rt = None
            self.backend = "torch"
        else:
            self._rt = cudart
            self.backend = "cuda-python"

    def record(self, stream: torch.cuda.Stream) -> Any:
        """An event recorded now on ``stream`` (captures the work enqueued on it so far)."""
        if self._rt is None:
            event = self._free.pop() if self._free else torch.cuda.Event(enable_timing=True)
            event.record(stream)
            return event
        if self._free:
            event = self._free.pop()
        else:
            with torch.cuda.device(self.device):  # cudaEventCreate uses the thread's current device
                event = self._check("cudaEventCreate", self._rt.cudaEventCreate())[0]
            self._all.append(event)
        self._check("cudaEventRecord", self._rt.cudaEventRecord(event, stream.cuda_stream))
        return event

    def done(self, event: Any) -> bool:
        """Whether the work captured by ``event`` has finished; never blocks."""
        if self._rt is None:
            return event.query()
        result = self._rt.cudaEventQuery(event)
        if result[0] == self._rt.cudaError_t.cudaErrorNotReady:
            return False
        self._check("cudaEventQuery", result)
        return True

    def elapsed_s(self, start: Any, end: Any) -> float:
        """Seconds between two completed events."""
        if self._rt is None:
            return start.elapsed_time(end) / 1e3
        return self._check("cudaEventElapsedTime", self._rt.cudaEventElapsedTime(start, end))[0] / 1e3

    def release(self, *events: Any) -> None:
        """Give completed events back for reuse."""
        self._free.extend(events)

    def close(self) -> None:
        """Destroy the events (idempotent; in-flight ones are released by the driver once complete)."""
        if self._rt is not None:
            for event in self._all:
                self._rt.cudaEventDestroy(event)
        self._all.clear()
        self._free.clear()

    def _check(self, name: str, result: tuple) -> tuple:
        err, values = result[0], result[1:]
        if err != self._rt.cudaError_t.cudaSuccess:
            message = self._rt.cudaGetErrorString(err)[1]
            raise RuntimeError(f"{name} failed: {err!r} ({message.decode() if isinstance(message, bytes) else message})")
        return values
