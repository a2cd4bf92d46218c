"""The driver side of ``serve_throughput``'s load: start the client processes (benchmarks/serve_clients.py)
on the CPUs they may use, all sending at one agreed moment, and merge their records into throughput,
TTFT / TPOT / ITL percentiles and the kernel's count of handshakes dropped on a full listen queue."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

from benchmarks.common import fresh_cache_salt


def listen_overflows() -> Optional[int]:
    """The kernel's count of handshakes dropped because a listen queue was full (Linux, machine-wide):
    each such client retries after a second (entrypoints/openai/listen_backlog.py)."""
    try:
        lines = [line.split() for line in Path("/proc/net/netstat").read_text().splitlines() if line.startswith("TcpExt:")]
        return int(dict(zip(lines[0], lines[1]))["ListenOverflows"])
    except (OSError, IndexError, KeyError, ValueError):
        return None


def cpu_list(text: str) -> set[int]:
    """A kernel CPU list ("0-3,8") as a set."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return cpus


def cpu_text(cpus: Optional[set[int]]) -> str:
    """A set of CPUs as the kernel writes it ("0-2,4-15"); "any" for None."""
    if not cpus:
        return "any"
    ordered, runs = sorted(cpus), []
    start = prev = ordered[0]
    for cpu in ordered[1:] + [None]:
        if cpu is not None and cpu == prev + 1:
            prev = cpu
            continue
        runs.append(str(start) if start == prev else f"{start}-{prev}")
        if cpu is not None:
            start = prev = cpu
    return ",".join(runs)


def run_clients(url: str, model: str, requests, processes: int, cpus: Optional[set[int]] = None) -> dict[str, Any]:
    """Split the requests round-robin over ``processes`` client processes, send all at once, merge.
    ``cpus``: the CPUs the client processes may run on (None: anywhere)."""
    processes = max(1, min(processes, len(requests)))
    overflows_before = listen_overflows()
    with tempfile.TemporaryDirectory() as tmp:
        start_at = time.time() + 3.0  # every process imported and connected by then
        salt = fresh_cache_salt()  # one per run: repeats and the warm-up never hit each other's prefixes
        procs = []
        for i in range(processes):
            share = [[r.prompt, r.max_tokens] for r in requests[i::processes]]
            (Path(tmp) / f"in{i}.json").write_text(json.dumps(share))
            procs.append(subprocess.Popen([sys.executable, "-m", "benchmarks.serve_clients", "--url", url, "--model",
                                           model, "--requests", str(Path(tmp) / f"in{i}.json"), "--start-at",
                                           str(start_at), "--cache-salt", salt, "--out", str(Path(tmp) / f"out{i}.json")]))
            if cpus:
                os.sched_setaffinity(procs[-1].pid, cpus)  # before it has imported anything or connected
        for proc in procs:
            if proc.wait() != 0:
                raise RuntimeError(f"a client process exited with {proc.returncode}")
        outs = [json.loads((Path(tmp) / f"out{i}.json").read_text()) for i in range(processes)]
    overflows_after = listen_overflows()
    records = [r for o in outs for r in o["records"]]
    bad = [r for r in records if r["status"] != "ok"]
    if bad:
        raise RuntimeError(f"{len(bad)} requests failed, e.g. {bad[0]['status']}: {bad[0]['error']}")
    first = min(r["sent"] for r in records)
    last = max(r["sent"] + r["e2e"] for r in records)
    got = sum(r["output_tokens"] for r in records)
    seconds = last - first
    return {"output_tokens": got, "seconds": seconds, "tok_per_s": got / seconds,
            "client_cpu_s": [round(o["cpu_s"], 2) for o in outs],
            "client_busiest_cpu_share": max(o["cpu_s"] for o in outs) / seconds,
            "client_cpus": cpu_text(cpus),
            "listen_overflows": (None if overflows_before is None or overflows_after is None
                                 else overflows_after - overflows_before),
            **latencies(records)}


def latencies(records: list[dict]) -> dict[str, Any]:
    import numpy as np

    def pct(values) -> dict[str, Optional[float]]:
        if not values:
            return {"p50": None, "p99": None}
        a = np.asarray(values) * 1e3
        return {"p50": float(np.percentile(a, 50)), "p99": float(np.percentile(a, 99))}

    tpot = [(r["e2e"] - r["ttft"]) / (r["output_tokens"] - 1) for r in records
            if r["ttft"] is not None and r["output_tokens"] > 1]
    return {"ttft_ms": pct([r["ttft"] for r in records if r["ttft"] is not None]), "tpot_ms": pct(tpot),
            "itl_ms": pct([gap for r in records for gap in r["itl"]])}
