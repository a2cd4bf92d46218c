"""Nineteenth session: what one GIL turn costs a busy Python thread on this host.

``pingpong``: two threads hand a token back and forth through two locks (each handoff a futex wake
and a GIL transfer): the one-way handoff's latency. ``turn``: a busy Python loop (the engine thread's
stand-in) runs a fixed amount of work alone, then beside a thread that wakes every 0.5 ms, takes the
GIL for a moment (as the grammar worker does between llguidance's calls) and sleeps again; the busy
loop's extra wall time per wake is the price of one turn, at each switch interval given in µs
(default 50, grammar_worker.py's HANDOFF, and 5000, the interpreter's default)."""
import json
import os
import sys
import threading
import time


def pingpong(n=20000):
    a, b = threading.Lock(), threading.Lock()
    a.acquire(); b.acquire()

    def other():
        for _ in range(n):
            a.acquire()
            b.release()
    t = threading.Thread(target=other); t.start()
    start = time.perf_counter()
    for _ in range(n):
        a.release()
        b.acquire()
    wall = time.perf_counter() - start
    t.join()
    return wall / (2 * n) * 1e6  # µs a one-way handoff


def busy(iterations):
    x = 0
    for i in range(iterations):
        x += i & 7
    return x


def turn(interval, iterations=3_000_000, period=0.0005):
    sys.setswitchinterval(interval)
    busy(iterations // 10)
    alone = min(_timed(busy, iterations) for _ in range(3))
    stop = threading.Event()
    wakes = [0]

    def waker():
        while not stop.is_set():
            time.sleep(period)
            wakes[0] += 1  # a moment with the GIL, as the worker between llguidance's calls
    results = []
    for _ in range(3):
        wakes[0] = 0
        stop.clear()
        t = threading.Thread(target=waker); t.start()
        wall = _timed(busy, iterations)
        stop.set(); t.join()
        results.append((wall, wakes[0]))
    wall, n = min(results)
    sys.setswitchinterval(0.005)
    return {"alone_ms": alone * 1e3, "beside_ms": wall * 1e3, "wakes": n,
            "us_per_turn": (wall - alone) / max(n, 1) * 1e6}


def _timed(fn, *args):
    s = time.perf_counter(); fn(*args); return time.perf_counter() - s


if __name__ == "__main__":
    intervals = [float(x) for x in sys.argv[2:]] or [50, 5000]
    out = {"cpus": len(os.sched_getaffinity(0)), "pingpong_us": min(pingpong() for _ in range(3)),
           **{f"turn_{x:g}us": turn(x * 1e-6) for x in intervals}}
    print(json.dumps(out, indent=1))
    if len(sys.argv) > 1:
        json.dump(out, open(sys.argv[1], "w"), indent=1)
