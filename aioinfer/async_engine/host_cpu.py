"""Keeping the engine's Python threads on one CPU (the ``host_cpu`` option).

In one process the event loop's thread and the GPU thread take turns on one interpreter lock, so
they never run Python at the same time, and on two cores each turn hands the lock, and the objects
both touch, from one core's caches to the other's. On the H200 (qwen2.5-0.5b, 256 streams, one
benchmark call) the async ``Engine`` delivered 37.5k tok/s with the threads where the OS put them
and 44.4k with the process on one core: the GPU thread spent 15.0 instead of 18.0 µs a token, the
loop 7.5 instead of 9.1 (docs/performance.md). Only these threads are pinned, after the model has
loaded: the CUDA driver's threads and the tokenizer's pool keep the CPUs they started with.

Linux only (``os.sched_setaffinity`` on a thread).
"""

from __future__ import annotations

import os
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


def pin_this_thread(cpu: int) -> set[int]:
    """Run the calling thread on ``cpu`` only; returns the CPUs it could run on before."""
    before = os.sched_getaffinity(0)  # on Linux, pid 0 is the calling thread
    os.sched_setaffinity(0, {cpu})
    return before


def unpin_this_thread(cpus: set[int]) -> None:
    os.sched_setaffinity(0, cpus)
