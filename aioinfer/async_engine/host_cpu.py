"""Keeping the engine's Python threads on one CPU (the ``host_cpu`` option).

In one process the event loop's thread and the GPU thread take turns on one interpreter lock, so
they never run Python at the same time, and on two cores each turn hands the lock, and the objects
both touch, from one core's caches to the other's. On the H200 (qwen2.5-0.5b, 256 streams, one
benchmark call) the async ``Engine`` delivered 37.5k tok/s with the threads where the OS put them
and 44.4k with the process on one core: the GPU thread spent 15.0 instead of 18.0 µs a token, the
loop 7.5 instead of 9.1 (2026-12-01). Only these threads are pinned, after the model has
loaded: the CUDA driver's threads and the tokenizer's pool keep the CPUs they started with. The
event loop's thread is the caller's: it gets its CPUs back when the last engine pinned to it ends
(data-parallel replicas share one loop, and every replica's GPU thread goes to the same CPU).

Linux only (``os.sched_setaffinity`` on a thread).
"""

from __future__ import annotations

import os
import threading
from typing import Optional


def check_host_cpu(cpu: Optional[int]) -> None:
    """ValueError unless ``cpu`` is None or a CPU this process may run on (and this OS can pin threads)."""
    if cpu is None:
        return
    if not isinstance(cpu, int) or isinstance(cpu, bool) or cpu < 0:
        raise ValueError(f"host_cpu must be a CPU number (an integer >= 0) or None, got {cpu!r}")
    if not hasattr(os, "sched_setaffinity"):
        raise ValueError("host_cpu needs Linux (os.sched_setaffinity): leave it unset on this system")
    allowed = os.sched_getaffinity(0)
    if cpu not in allowed:
        raise ValueError(f"host_cpu {cpu} is not a CPU this process may run on ({sorted(allowed)})")


def pin_this_thread(cpu: int) -> None:
    """Run the calling thread (the GPU thread, for the rest of its life) on ``cpu`` only."""
    os.sched_setaffinity(0, {cpu})  # on Linux, pid 0 is the calling thread


# The event loop's thread is the caller's and may serve several engines (data parallel replicas,
# entered and left in any order): per thread, how many engines pinned it and its CPUs before the first.
_loop_pins: dict[int, tuple[int, set[int]]] = {}
_loop_pins_lock = threading.Lock()


def pin_loop_thread(cpu: int) -> None:
    """Pin the calling thread (an engine's event loop) to ``cpu``; undone by ``unpin_loop_thread``."""
    with _loop_pins_lock:
        ident = threading.get_ident()
        count, before = _loop_pins.get(ident, (0, None))
        if before is None:
            before = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {cpu})
        _loop_pins[ident] = (count + 1, before)


def unpin_loop_thread() -> None:
    """One engine on this thread is done with it: the last one gives the thread its CPUs back."""
    with _loop_pins_lock:
        ident = threading.get_ident()
        count, before = _loop_pins.pop(ident, (0, None))
        if count > 1:
            _loop_pins[ident] = (count - 1, before)
        elif before is not None:
            os.sched_setaffinity(0, before)
