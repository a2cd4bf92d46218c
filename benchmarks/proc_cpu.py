"""CPU time per thread of a process, from Linux's /proc (the host budget: one interpreter lock
is shared by every Python thread of a process, so the per-thread split says where it goes).

Threads are named by their OS name (``/proc/PID/task/TID/comm``): the engine names its GPU thread
``aioinfer-gpu``; the main thread carries the process name (it runs the event loop in the server
and in the async benchmark). Empty results off Linux.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def thread_cpu(pid: Optional[int] = None) -> dict[int, tuple[str, float]]:
    """tid -> (OS thread name, user + system CPU seconds so far) for every live thread of ``pid``."""
    root = Path(f"/proc/{pid or os.getpid()}/task")
    out: dict[int, tuple[str, float]] = {}
    try:
        tids = [int(t) for t in os.listdir(root)]
    except OSError:
        return out
    for tid in tids:
        try:
            stat = (root / str(tid) / "stat").read_text()
            name = (root / str(tid) / "comm").read_text().strip()
        except OSError:
            continue  # ended meanwhile
        fields = stat.rsplit(")", 1)[1].split()
        out[tid] = (name, (int(fields[11]) + int(fields[12])) / _TICK)  # utime, stime: fields 14, 15
    return out


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of the whole process ``pid`` so far (its threads, dead ones included)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK


def children(pid: int) -> list[int]:
    """The direct children of ``pid`` (e.g. hypercorn's worker process under its master)."""
    found: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            text = Path(f"/proc/{pid}/task/{tid}/children").read_text().split()
            found.extend(int(c) for c in text)
    except OSError:
        pass
    return found


def split_by_role(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]],
                  main_tid: int) -> dict[str, float]:
    """CPU seconds spent between two snapshots, by role: the GPU thread, the main thread (the event
    loop, or the offline engine's caller), and all other threads together (torch's CPU pool,
    hypercorn's helpers, CUDA driver threads). Threads that ended in between are not counted."""
    roles = {"gpu_thread": 0.0, "main_thread": 0.0, "other_threads": 0.0}
    for tid, (name, seconds) in after.items():
        spent = seconds - before.get(tid, (name, 0.0))[1]
        if name.startswith("aioinfer-gpu"):
            roles["gpu_thread"] += spent
        elif tid == main_tid:
            roles["main_thread"] += spent
        else:
            roles["other_threads"] += spent
    return roles
