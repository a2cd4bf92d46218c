"""Which of the VM's CPUs share a physical core (the VM reports one thread a core, which a KVM guest
may say of hyperthreads): a fixed Python loop timed on CPU t while a spinning process runs on CPU o
(every ordered pair), against the same loop with nothing running, just before. Then the loop on CPU t
with every other CPU spinning, or streaming memory (64 MB arrays), to see what a busy host does to it.

    python siblings.py [--out FILE.json]
"""
import argparse
import json
import multiprocessing as mp
import os
import statistics
import time


def spinner(cpu, flags, stop):
    os.sched_setaffinity(0, {cpu})
    import numpy as np
    big = None
    x = 0
    while not stop.value:
        mode = flags[cpu]
        if mode == 1:
            for _ in range(20000):
                x += 1
        elif mode == 2:
            if big is None:
                big = np.zeros(8 << 20)  # 64 MB
            big += 1.0
        else:
            time.sleep(0.0005)


def work():
    d = {}
    out = []
    for i in range(20000):
        d[i & 1023] = i
        out.append(i)
        if len(out) > 100:
            out.clear()
    return d


def timed(n=5):
    times = []
    for _ in range(n):
        t = time.perf_counter()
        work()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=None)
    args = p.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    ctx = mp.get_context("spawn")
    flags = ctx.Array("i", max(cpus) + 1, lock=False)
    stop = ctx.Value("i", 0, lock=False)
    procs = [ctx.Process(target=spinner, args=(c, flags, stop)) for c in cpus]
    for proc in procs:
        proc.start()
    time.sleep(2.0)
    pairs = {}
    busy = {}
    for t in cpus:
        os.sched_setaffinity(0, {t})
        timed(3)
        for o in cpus:
            if o == t:
                continue
            base = timed()
            flags[o] = 1
            time.sleep(0.004)
            loaded = timed()
            flags[o] = 0
            time.sleep(0.002)
            pairs[f"{t},{o}"] = loaded / base
        for mode, name in ((1, "all_spin"), (2, "all_stream")):
            base = timed()
            for o in cpus:
                if o != t:
                    flags[o] = mode
            time.sleep(0.05)
            loaded = timed(9)
            for o in cpus:
                flags[o] = 0
            time.sleep(0.02)
            busy.setdefault(name, {})[t] = loaded / base
    stop.value = 1
    for proc in procs:
        proc.join()
    print(f"{'cpu':>3} {'worst partner':>13} {'slowdown':>8} {'2nd':>5} {'all spin':>8} {'all stream':>10}")
    for t in cpus:
        row = sorted(((pairs[f'{t},{o}'], o) for o in cpus if o != t), reverse=True)
        print(f"{t:>3} {row[0][1]:>13} {row[0][0]:>8.3f} {(row[1][0] if len(row) > 1 else 0):>5.3f} {busy['all_spin'][t]:>8.3f} "
              f"{busy['all_stream'][t]:>10.3f}")
    if args.out:
        json.dump({"pairs": pairs, "busy": busy}, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
