"""What a thread handoff costs on this host, and whether keeping the CPUs awake changes it.

The grammar worker's three GIL turns a step cost the engine thread 0.13-0.18 ms off the CPU on the
slow H200 hosts (the twentieth session): about two thread wake-ups each. A KVM guest whose idle CPUs
halt (no ``haltpoll`` cpuidle driver) pays the host's wake-up of a halted vCPU on each; a guest that
polls before halting, or a CPU kept busy by a task of the lowest class (SCHED_IDLE, which any other
task preempts at once), might not (on the CI machine the spinners sped the ping-pong up but did not
make turns cheaper: docs/performance.md). This prints the guest's cpuidle driver and times, per variant:

- ``pingpong``: two Python threads handing a token back and forth through two locks (two wake-ups
  a round trip; µs a round trip);
- ``turns``: an "engine" thread running Python (a fixed loop with a small torch op every ~20 µs,
  which releases the GIL) while a "worker" thread does 3 GIL turns a job (GIL-free sleeps of 0.2 and
  0.3 ms standing in for llguidance's two calls, the switch interval at 50 µs as in
  grammar_worker.py), on its own timer (a job every ~2 ms) or ``queued`` by the engine loop every
  ~2 ms (grammar_worker.py's form): the engine's loss, µs of its progress a turn against the loop alone.

Variants: ``free`` (threads where the OS puts them), ``apart`` (the threads pinned to two CPUs),
``apart_awake`` (the same, with a SCHED_IDLE spinning process on each of the two CPUs), ``one``
(both threads on one CPU).

    python wake.py [--out FILE.json]
"""
import argparse
import json
import multiprocessing as mp
import os
import queue
import statistics
import sys
import threading
import time

import torch


def spin(cpu, stop):
    os.sched_setaffinity(0, {cpu})
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    while not stop.is_set():
        for _ in range(10000):
            pass


def pin(cpu):
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})


def pingpong(cpus, rounds=3000):
    a, b = threading.Lock(), threading.Lock()
    a.acquire()
    b.acquire()
    done = []

    def other():
        pin(cpus[1])
        for _ in range(rounds):
            a.acquire()
            b.release()
    t = threading.Thread(target=other)
    t.start()
    pin(cpus[0])
    times = []
    for _ in range(rounds):
        s = time.perf_counter()
        a.release()
        b.acquire()
        times.append(time.perf_counter() - s)
    t.join()
    return 1e6 * statistics.median(times), 1e6 * statistics.mean(times)


def engine_loop(seconds, cpu, submit=None, every=100):
    """Python work with a small torch op every ~20 µs: iterations done in ``seconds``; ``submit()``
    every ``every`` iterations (about every 2 ms), as the engine queues the grammar worker's job."""
    pin(cpu)
    x = torch.zeros(8)
    objs = [{"a": i, "b": [i, i + 1]} for i in range(64)]
    n = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for o in objs:  # ~20 µs of Python
            o["a"] += 1
            o["b"].append(o["a"])
            o["b"].pop()
        x.add_(1)  # releases and retakes the GIL
        n += 1
        if submit is not None and n % every == 0:
            submit()
    return n


def turns(cpus, queued, seconds=0.3, repeats=5):
    """The engine loop alone and beside the worker, alternating ``repeats`` times; the loss per turn
    from each with-worker run against the mean of the alone runs beside it (the host's pace drifts).
    ``queued``: the worker takes jobs the engine loop queues (grammar_worker.py's form: the engine's
    put wakes it), else it runs on its own timer (a sleep between steps)."""
    stop = threading.Event()
    count = [0]
    jobs = queue.SimpleQueue()

    def worker():
        pin(cpus[1])
        while True:
            if queued:
                if jobs.get() is None:
                    return
            else:
                go.wait()
                if stop.is_set():
                    return
            count[0] += 1  # the pickup: a turn (for the timer form, the sleep's return below)
            time.sleep(0.0002)  # GIL-free, like llguidance's consume; its return is a turn
            count[0] += 1
            time.sleep(0.0003)  # the masks; its return is a turn
            count[0] += 1
            if not queued:
                time.sleep(0.0015)
    go = threading.Event()
    t = threading.Thread(target=worker, daemon=True)
    t.start()
    saved = sys.getswitchinterval()
    sys.setswitchinterval(50e-6)
    losses, fractions = [], []
    noop = lambda: None  # noqa: E731
    put = lambda: jobs.put(1)  # noqa: E731
    try:
        alone = [engine_loop(seconds, cpus[0], noop)]
        for _ in range(repeats):
            counted = count[0]
            go.set()
            with_worker = engine_loop(seconds, cpus[0], put if queued else noop)
            go.clear()
            time.sleep(0.01)
            num_turns = count[0] - counted
            alone.append(engine_loop(seconds, cpus[0], noop))
            base = statistics.mean(alone[-2:])
            losses.append(1e6 * seconds * (1 - with_worker / base) / max(1, num_turns))
            fractions.append(1 - with_worker / base)
    finally:
        sys.setswitchinterval(saved)
        stop.set()
        go.set()
        jobs.put(None)
        t.join()
    return {"loss_us_per_turn": statistics.median(losses), "losses_us": [round(x, 1) for x in losses],
            "turns": count[0], "engine_loss_fraction": statistics.median(fractions)}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out")
    args = p.parse_args()
    info = {}
    for name in ("current_driver", "current_governor_ro"):
        try:
            info[name] = open(f"/sys/devices/system/cpu/cpuidle/{name}").read().strip()
        except OSError as e:
            info[name] = f"({e.strerror})"
    try:
        info["cmdline"] = open("/proc/cmdline").read().strip()
    except OSError:
        pass
    allowed = sorted(os.sched_getaffinity(0))
    c0, c1 = allowed[-2], allowed[-1]
    print(info, flush=True)
    results = {}
    for variant, cpus, awake in (("free", (None, None), False), ("apart", (c0, c1), False),
                                 ("apart_awake", (c0, c1), True), ("one", (c1, c1), False),
                                 ("free_again", (None, None), False)):
        stop = mp.Event()
        spinners = [mp.Process(target=spin, args=(c, stop), daemon=True) for c in ((c0, c1) if awake else ())]
        for s in spinners:
            s.start()
        time.sleep(0.2)
        before = os.sched_getaffinity(0)
        try:
            pp = pingpong(cpus)
            timer = turns(cpus, queued=False)
            os.sched_setaffinity(0, before)
            job = turns(cpus, queued=True)
        finally:
            os.sched_setaffinity(0, before)
            stop.set()
            for s in spinners:
                s.join()
        results[variant] = {"pingpong_us_median": pp[0], "pingpong_us_mean": pp[1], "timer": timer, "queued": job}
        print(f"{variant:12s} pingpong {pp[0]:6.1f} us (mean {pp[1]:6.1f})  loss a turn: timer {timer['loss_us_per_turn']:6.1f} us "
              f"{timer['losses_us']}, queued {job['loss_us_per_turn']:6.1f} us {job['losses_us']} "
              f"(engine {-100 * job['engine_loss_fraction']:+.1f} %)", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"info": info, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
