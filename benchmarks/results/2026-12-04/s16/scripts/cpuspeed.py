"""Sixteenth session, a probe: how fast the engine thread's kind of Python runs while llguidance
works beside it, and why. A fixed pure-Python workload W (an update-like loop over 256 slotted
objects, 16 times: about 0.5-1 ms) is timed on the main thread, wall and thread CPU, under:

  idle        nothing else
  sub_T       llguidance computing 256 masks in a loop in another process on T threads (no GIL
              shared: only the CPUs' shared caches, memory and clocks)
  thread_T    the same loop in a thread of this process (its GIL turn once a mask batch)
  worker_T    the product's pattern: every 2.5 ms a job to a GrammarWorker (256 matchers take a
              token, then 256 masks), HANDOFF switch interval while it runs

    python cpuspeed.py TOKENIZER_DIR [--reps 400]
"""
import gc
import os
import statistics
import subprocess
import sys
import threading
import time

import torch

TOK = sys.argv[1]
REPS = int(sys.argv[sys.argv.index("--reps") + 1]) if "--reps" in sys.argv else 400
VOCAB = 151_936
WORDS = (VOCAB + 31) // 32


def make_matchers(n=256):
    from transformers import AutoTokenizer

    from aioinfer.structured_output import StructuredOutputsParams
    from aioinfer.structured_output.compiler import GrammarCompiler
    from benchmarks.offline_throughput import STRUCTURED_SCHEMAS

    tok = AutoTokenizer.from_pretrained(TOK)
    compiler = GrammarCompiler(tok, VOCAB, [tok.eos_token_id])
    params = StructuredOutputsParams(json=STRUCTURED_SCHEMAS["strings"])
    prefix = tok.encode('{"notes": ["abc', add_special_tokens=False)
    a = tok.encode("a", add_special_tokens=False)[0]
    ms = []
    for _ in range(n):
        m = compiler.compile(params)
        assert m.consume_tokens(prefix), m.get_error()
        ms.append(m)
    return ms, a


def mask_loop(threads, stop=None, announce=False):
    import llguidance
    ms, a = make_matchers()
    ex = llguidance.LLExecutor(threads)
    host = torch.empty((len(ms), WORDS), dtype=torch.int32)
    plain = [(m, i) for i, m in enumerate(ms)]
    if announce:
        print("ready", flush=True)
    while stop is None or not stop.is_set():
        ex.unsafe_compute_mask_ptr(plain, host.data_ptr(), WORDS * 4, len(ms))


class Row:
    __slots__ = ("pending", "out", "limit", "rid", "stops")

    def __init__(self, i):
        self.pending, self.out, self.limit, self.rid, self.stops = 1, [], 10**9, str(i), frozenset((1, 2))


ROWS = [Row(i) for i in range(256)]
TABLE = {r.rid: r for r in ROWS}


def work():
    outs = []
    for _ in range(16):
        for i, rid in enumerate(TABLE):
            r = TABLE.get(rid)
            r.pending -= 1
            r.out.append(i)
            n = len(r.out)
            if n >= r.limit or i in r.stops:
                outs.append(None)
            outs.append((rid, [i], n, r.pending + 1))
            r.pending += 1
    for r in ROWS:
        r.out.clear()
    return outs


def measure(label, during=None):
    gc.collect()
    gc.disable()  # its collections are not what this measures (the heap holds torch and transformers)
    walls, cpus = [], []
    for k in range(REPS):
        if during is not None:
            during()
        t, c = time.perf_counter(), time.thread_time()
        work()
        walls.append(time.perf_counter() - t)
        cpus.append(time.thread_time() - c)
    gc.enable()
    w, c = statistics.mean(walls) * 1e6, statistics.mean(cpus) * 1e6
    print(f"{label:>12}: W mean wall {w:7.1f} us  cpu {c:7.1f} us  (median wall {statistics.median(walls) * 1e6:7.1f}"
          f" cpu {statistics.median(cpus) * 1e6:7.1f})", flush=True)
    return w, c


def main():
    results = {}
    for _ in range(50):
        work()
    results["idle"] = measure("idle")
    for threads in (4, 12):
        proc = subprocess.Popen([sys.executable, __file__, TOK, "--child", str(threads)], stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.3)
        results[f"sub_{threads}"] = measure(f"sub_{threads}")
        proc.kill()
        proc.wait()
    results["idle2"] = measure("idle2")
    for threads in (4,):
        stop = threading.Event()
        th = threading.Thread(target=mask_loop, args=(threads, stop), daemon=True)
        th.start()
        time.sleep(3.0)  # its matchers built
        results[f"thread_{threads}"] = measure(f"thread_{threads}")
        stop.set()
        th.join()
    from aioinfer.worker.grammar_worker import HANDOFF, GrammarWorker, MaskJob
    ms, a = make_matchers()
    for threads in (4, 2):
        worker = GrammarWorker(threads, os.sched_getaffinity(0), HANDOFF)
        host = torch.empty((len(ms), WORDS), dtype=torch.int32)
        plain = [(m, i) for i, m in enumerate(ms)]
        state = {"job": None, "at": 0.0}

        def during():
            now = time.perf_counter()
            job = state["job"]
            if now - state["at"] >= 2.5e-3 and (job is None or job.is_done()):
                if job is not None:
                    job.wait()
                state["job"] = MaskJob([(m, a) for m in ms], plain, [], host.data_ptr(), WORDS * 4, len(ms))
                worker.submit(state["job"])
                state["at"] = now
        results[f"worker_{threads}"] = measure(f"worker_{threads}", during)
        if state["job"] is not None:
            state["job"].wait()
        worker.close()
    results["idle3"] = measure("idle3")


if __name__ == "__main__":
    if "--child" in sys.argv:
        mask_loop(int(sys.argv[sys.argv.index("--child") + 1]), announce=True)
    else:
        main()
