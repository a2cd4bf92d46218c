"""GPU thread -> event loop hand-off that does not wait for the loop (bounded, in order).

``anyio.from_thread.run_sync`` blocks the calling thread until the event loop has run the call.
With hundreds of streams the loop is busy waking their consumers after each step, so the GPU
thread, which launches the next step only after delivering this one, stood idle behind them: on
the H200 the async engine reached 7.5-9.6k tok/s on workload 1 where the offline ``LLM`` does 12.3k,
and two data-parallel replicas together no more than one.

Here the GPU thread appends the call to a queue and schedules one drain on the loop if none is
pending (``run_sync_soon``: no waiting). The drain runs everything queued, in order, so a busy loop
takes several steps' results in one go (and their consumers wake once for several tokens). The
queue is bounded: once ``max_pending`` calls are waiting, the GPU thread waits for the loop. That
is the backpressure of the blocking call, loosened by a few steps; it still never waits for a client.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from typing import Any, Callable

import anyio.lowlevel

logger = logging.getLogger(__name__)

_WAIT_SLICE_S = 0.5  # a blocked producer re-checks for close() this often


class LoopBridge:
    def __init__(self, token: anyio.lowlevel.EventLoopToken, on_error: Callable[[BaseException], None],
                 max_pending: int = 4) -> None:
        if max_pending < 1:
            raise ValueError(f"max_pending must be >= 1, got {max_pending}")
        self._token = token
        self._on_error = on_error  # called on the loop when a handed-over call raises
        self._max_pending = max_pending
        self._pending: deque[tuple[Callable[[Any], None], Any]] = deque()
        self._drain_scheduled = False
        self._closed = False
        self._cond = threading.Condition()

    def call(self, func: Callable[[Any], None], arg: Any) -> bool:
        """From the producer thread: run ``func(arg)`` on the loop after every earlier call.

        Returns at once unless ``max_pending`` calls are already waiting. Returns False (and drops
        the call) once the bridge is closed or the loop has finished.
        """
        with self._cond:
            while len(self._pending) >= self._max_pending and not self._closed:
                self._cond.wait(_WAIT_SLICE_S)
            if self._closed:
                return False
            self._pending.append((func, arg))
            if self._drain_scheduled:
                return True
            self._drain_scheduled = True
        try:
            self._schedule_drain()
        except RuntimeError:  # the event loop has finished (anyio.RunFinishedError) or is closing
            self.close()
            return False
        except BaseException:
            self.close()  # nothing queued here can run: the caller learns why, later calls are dropped
            raise
        return True

    def close(self) -> None:
        """Drop whatever is queued and refuse further calls; wakes a blocked producer."""
        with self._cond:
            self._closed = True
            self._pending.clear()
            self._cond.notify_all()

    def _schedule_drain(self) -> None:
        """Run ``_drain`` on the loop soon, without waiting (any thread)."""
        native = self._token.native_token
        run_sync_soon = getattr(self._token.backend_class, "run_sync_soon", None)
        if run_sync_soon is not None:
            run_sync_soon(self._drain, (), native)
        elif hasattr(native, "call_soon_threadsafe"):  # older anyio (the H200 image's) on asyncio: the loop
            if native.is_closed():
                raise RuntimeError("the event loop is closed")
            native.call_soon_threadsafe(self._drain)
        else:  # older anyio on trio: a TrioToken
            native.run_sync_soon(self._drain)

    def _drain(self) -> None:  # on the loop
        with self._cond:
            batch = list(self._pending)
            self._pending.clear()
            self._drain_scheduled = False
            self._cond.notify_all()
        for func, arg in batch:
            try:
                func(arg)
            except Exception as exc:  # noqa: BLE001 - the producer cannot see it; the engine must
                logger.exception("a call handed over from the GPU thread failed")
                self._on_error(exc)
