"""Does llguidance computing masks beside it slow a Python thread down, and how: a fixed Python
workload (engine-like: attribute reads, dict lookups, list appends over 128 objects) timed in
chunks on the main thread, while a load computes 128 masks a ~2.5 ms period (the step's), switched
on and off every 40 ms, so that each chunk is compared with chunks of the same second (the host's
speed drifts within a call). Loads: llguidance in another process (its CPU alone), in a thread of
this process (its CPU and the GIL turns), each with N llguidance threads.

    python interfere.py --tokenizer .ab/tok [--seconds 6] [--objects 128]

The eighteenth session's copy: with more than 1024 objects each chunk takes a window of 1024 of
them, walking the whole set (the seventeenth's chunk walked all of them, 12 ms, so that a 40 ms
switch left one chunk to time). Call 2 of the seventeenth ran it with 128 objects (a working set in the core's own caches): no slowdown. ``--objects``
(added after, for the next session) makes the working set the engine's size (tens of thousands of
objects, megabytes: the shared cache, which llguidance's trie walks and 2.4 MB of masks a step also use).
"""
import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import threading
import time

SCHEMA = {"type": "object", "required": ["notes"], "additionalProperties": False,
          "properties": {"notes": {"type": "array", "minItems": 1000, "items": {"type": "string"}}}}
V = 151936
W = (V + 31) // 32


def make_matchers(tokenizer_path, n=128, seed=0):
    """n matchers walked a random number of random allowed tokens into the schema (the benchmark's mix)."""
    import numpy as np
    import llguidance
    import torch
    from transformers import AutoTokenizer

    sys.path.insert(0, os.getcwd())
    from aioinfer.structured_output.llg_tokenizer import llg_tokenizer
    tok = llg_tokenizer(AutoTokenizer.from_pretrained(tokenizer_path), V, None)
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(SCHEMA))
    rng = np.random.default_rng(seed)
    mask = torch.empty((1, W), dtype=torch.int32)
    matchers = []
    for _ in range(n):
        m = llguidance.LLMatcher(tok, grammar, log_level=0)
        for _ in range(int(rng.integers(0, 200))):
            m.unsafe_compute_mask_ptr(mask.data_ptr(), W * 4)
            bits = np.unpackbits(mask.numpy().view(np.uint8), bitorder="little")[:V]
            m.consume_token(int(rng.choice(np.flatnonzero(bits))))
        matchers.append(m)
    return matchers


def load_loop(tokenizer_path, threads, on, stop, ready, period=2.5e-3):
    import llguidance
    import torch
    matchers = make_matchers(tokenizer_path)
    ex = llguidance.LLExecutor(threads)
    buf = torch.empty((len(matchers), W), dtype=torch.int32)
    pairs = list(zip(matchers, range(len(matchers))))
    ready.set()
    fills = []
    while not stop.is_set():
        if not on.is_set():
            time.sleep(0.0005)
            continue
        t = time.perf_counter()
        ex.unsafe_compute_mask_ptr(pairs, buf.data_ptr(), W * 4, len(matchers))
        d = time.perf_counter() - t
        fills.append(d)
        if period > d:
            time.sleep(period - d)
    if fills:
        print(f"    load: {len(fills)} fills, median {1e3 * statistics.median(fills):.3f} ms", flush=True)


class Obj:
    __slots__ = ("a", "b", "c", "ids")

    def __init__(self, i):
        self.a, self.b, self.c, self.ids = i, i * 2, str(i), list(range(i % 7 + 3))


def chunk(objs, table):
    out = []
    for o in objs:
        n = o.a + len(o.ids)
        if table.get(o.c) is not None and n > o.b - 10000:
            out.append((o.a, o.ids[-1], n))
        o.ids.append(n)
        if len(o.ids) > 20:
            del o.ids[:10]
    return out


def measure(on, seconds, toggle=0.04, objects=128):
    objs = [Obj(i) for i in range(objects)]
    table = {o.c: o for o in objs}
    rows = []  # (load on, wall, cpu)
    end = time.perf_counter() + seconds
    next_toggle = time.perf_counter() + toggle
    state = False
    skip = 0
    offset = 0
    while time.perf_counter() < end:
        now = time.perf_counter()
        if now >= next_toggle:
            state = not state
            (on.set if state else on.clear)()
            next_toggle = now + toggle
            skip = 3  # the first chunks after a switch belong to neither state
        t, c = time.perf_counter(), time.thread_time()
        if objects <= 1024:
            for _ in range(max(1, 1024 // objects)):
                chunk(objs, table)
        else:  # a window of 1024 objects a chunk, walking the whole set: short chunks, a large working set
            chunk(objs[offset:offset + 1024], table)
            offset = (offset + 1024) % (objects - 1024)
        w, c = time.perf_counter() - t, time.thread_time() - c
        if skip:
            skip -= 1
            continue
        rows.append((state, w, c))
    on.clear()
    on_w = [w for s, w, _ in rows if s]
    off_w = [w for s, w, _ in rows if not s]
    on_c = [c for s, _, c in rows if s]
    off_c = [c for s, _, c in rows if not s]
    return {"chunks_on": len(on_w), "chunks_off": len(off_w),
            "wall_us_off": 1e6 * statistics.median(off_w), "wall_us_on": 1e6 * statistics.median(on_w),
            "cpu_us_off": 1e6 * statistics.median(off_c), "cpu_us_on": 1e6 * statistics.median(on_c),
            "wall_mean_ratio": statistics.mean(on_w) / statistics.mean(off_w),
            "slowdown_median": statistics.median(on_w) / statistics.median(off_w)}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--seconds", type=float, default=6.0)
    p.add_argument("--threads", default="4,1")
    p.add_argument("--objects", type=int, default=128)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    results = []
    for where in ("process", "thread"):
        for threads in [int(t) for t in args.threads.split(",")]:
            if where == "process":
                ctx = mp.get_context("spawn")
                on, stop, ready = ctx.Event(), ctx.Event(), ctx.Event()
                worker = ctx.Process(target=load_loop, args=(args.tokenizer, threads, on, stop, ready))
            else:  # the engine's switch interval while a mask job runs (grammar_worker.HANDOFF)
                sys.setswitchinterval(50e-6)
                on, stop, ready = threading.Event(), threading.Event(), threading.Event()
                worker = threading.Thread(target=load_loop, args=(args.tokenizer, threads, on, stop, ready))
            worker.start()
            ready.wait()
            r = measure(on, args.seconds, objects=args.objects)
            stop.set()
            worker.join()
            sys.setswitchinterval(0.005)
            r.update(where=where, threads=threads, objects=args.objects)
            results.append(r)
            print(json.dumps(r), flush=True)
    print(f"{'load':>8} {'thr':>3} {'wall off us':>11} {'wall on us':>10} {'slowdown':>8} {'mean ratio':>10} {'cpu off':>7} {'cpu on':>7}")
    for r in results:
        print(f"{r['where']:>8} {r['threads']:>3} {r['wall_us_off']:>11.1f} {r['wall_us_on']:>10.1f} "
              f"{r['slowdown_median']:>8.3f} {r['wall_mean_ratio']:>10.3f} {r['cpu_us_off']:>7.1f} {r['cpu_us_on']:>7.1f}")
    if args.out:
        json.dump(results, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
