"""Probe: how much slower the scheduler's steps run while other threads hash, copy or fill masks (CPU).

Does the engine thread's Python run slower while other threads work, and which kind of work?
(H200, 2026-12-02: beside llguidance's mask fill, the constrained 0.5b engine
thread's ordinary scheduling code ran 40-75 % slower.)

    python -m benchmarks.probes.host_contention --tokenizer FOLDER [--threads 12] [--repeats 3]

The main thread runs the scheduler's real per-step work (``Scheduler.schedule`` + ``update`` on
workload 1's 256 requests, as ``benchmarks/probes/scheduler_cost.py``) while background threads, which
never take the GIL while they work, do one of:

- ``none``: nothing (the baseline);
- ``hash``: PBKDF2-SHA256 in a loop: CPU-bound, cache-light (hashlib drops the GIL for tens of ms);
- ``copy``: NumPy copies of a 64 MiB array in a loop: memory-bandwidth-bound (NumPy drops the GIL);
- ``masks``: llguidance filling the masks of 1,024 matchers of the free-strings schema (the
  engine's mask fill, ``LLExecutor`` with ``--threads`` threads) in a loop.

Each background call holds no GIL for milliseconds, so that the main thread seldom waits for the GIL
(what is measured is the cores, caches and memory, not the interpreter lock).

Per mode: the main thread's ms per scheduler step (median of the repeats). If ``hash`` slows it as
much as ``masks``, the cores themselves are shared (hyperthreads of the host under the VM, or the
clock falling with load); if only ``copy`` and ``masks`` do, it is the caches and memory bandwidth.

``--topology`` tells those two apart: the main thread pinned to CPU 0 beside one ``hash`` thread
pinned to each other CPU in turn (a hyperthread sibling of CPU 0 stands out), then beside ``hash``
threads on CPUs 1..n for growing n (a clock that falls with load slows it step by step).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import threading
from typing import Any, Callable

import numpy as np

from benchmarks.common import dump, environment, format_table
from benchmarks.probes.scheduler_cost import run_once

MODES = ("none", "hash", "copy", "masks")


def _hash_load(stop: threading.Event) -> None:
    while not stop.is_set():
        hashlib.pbkdf2_hmac("sha256", b"password", b"salt", 50_000)


def _pinned(load: Callable[[threading.Event], None], cpu: int) -> Callable[[threading.Event], None]:
    def run(stop: threading.Event) -> None:
        os.sched_setaffinity(0, {cpu})  # this thread only (Linux: 0 is the calling thread)
        load(stop)
    return run


def _beside(loads: list[Callable[[threading.Event], None]], num_blocks: int, seed: int) -> float:
    """The scheduler's ms per step while ``loads`` run, one thread each."""
    stop = threading.Event()
    workers = [threading.Thread(target=load, args=(stop,), daemon=True) for load in loads]
    for worker in workers:
        worker.start()
    try:
        return run_once(False, 1, seed, num_blocks)["ms_per_step"]
    finally:
        stop.set()
        for worker in workers:
            worker.join()


def topology(num_blocks: int) -> dict[str, Any]:
    """Main thread on CPU 0; one hash thread on each other CPU in turn; then hash threads on 1..n."""
    cpus = sorted(os.sched_getaffinity(0))
    saved = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpus[0]})
    try:
        alone = [_beside([], num_blocks, 0) for _ in range(2)]
        beside_one = {cpu: _beside([_pinned(_hash_load, cpu)], num_blocks, 0) for cpu in cpus[1:]}
        counts = [n for n in (1, 2, 4, 8, 12, len(cpus) - 1) if n < len(cpus)]
        beside_many = {n: _beside([_pinned(_hash_load, cpu) for cpu in cpus[1:1 + n]], num_blocks, 0)
                       for n in sorted(set(counts))}
        alone.append(_beside([], num_blocks, 0))
    finally:
        os.sched_setaffinity(0, saved)
    base = statistics.median(alone)
    print(f"topology: main thread on CPU {cpus[0]} alone {base:.3f} ms/step ({', '.join(f'{a:.3f}' for a in alone)})")
    print("  beside one hash thread on CPU: " + ", ".join(f"{c}: {v / base:.2f}x" for c, v in beside_one.items()))
    print("  beside hash threads on CPUs 1..n: " + ", ".join(f"n={n}: {v / base:.2f}x" for n, v in beside_many.items()))
    return {"alone_ms_per_step": alone, "beside_one_cpu": beside_one, "beside_n_cpus": beside_many}


def _copy_load(stop: threading.Event) -> None:
    src = np.ones(8 << 20)  # 64 MiB of float64
    dst = np.empty_like(src)
    while not stop.is_set():
        np.copyto(dst, src)


def _mask_load(tokenizer_dir: str, threads: int) -> Callable[[threading.Event], None]:
    import llguidance
    import torch
    from transformers import AutoTokenizer

    from aioinfer.structured_output import StructuredOutputsParams
    from aioinfer.structured_output.compiler import GrammarCompiler
    from benchmarks.offline_throughput import STRUCTURED_SCHEMAS

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    vocab = len(tokenizer)
    compiler = GrammarCompiler(tokenizer, vocab, [tokenizer.eos_token_id])
    params = StructuredOutputsParams(json=STRUCTURED_SCHEMAS["strings"])
    matchers = [compiler.compile(params) for _ in range(1024)]
    inside_a_string = tokenizer.encode('{"notes": ["a', add_special_tokens=False)
    for matcher in matchers:
        matcher.consume_tokens(inside_a_string)
    executor = llguidance.LLExecutor(threads)
    words = (vocab + 31) // 32
    masks = torch.empty((len(matchers), words), dtype=torch.int32)
    batch = [(m, i) for i, m in enumerate(matchers)]

    def load(stop: threading.Event) -> None:
        while not stop.is_set():
            executor.unsafe_compute_mask_ptr(batch, masks.data_ptr(), words * 4, len(matchers))
    return load


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokenizer", required=True, help="a tokenizer folder (the masks mode's vocabulary)")
    p.add_argument("--threads", type=int, default=12, help="background threads (the masks mode: llguidance's)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--num-blocks", type=int, default=20000)
    p.add_argument("--topology", action="store_true", help="also: which CPUs slow CPU 0 (see above)")
    p.add_argument("--out", default=None)
    args = p.parse_args()

    loads: dict[str, Any] = {"none": None, "hash": _hash_load, "copy": _copy_load,
                             "masks": _mask_load(args.tokenizer, args.threads)}
    runs: dict[str, list[float]] = {mode: [] for mode in MODES}
    run_once(False, 1, 0, args.num_blocks)  # warm-up
    for repeat in range(args.repeats):
        for mode in MODES:  # interleaved, so that the machine's drift falls on every mode alike
            stop = threading.Event()
            # llguidance runs its own threads: one Python thread drives them.
            count = 0 if loads[mode] is None else (1 if mode == "masks" else args.threads)
            workers = [threading.Thread(target=loads[mode], args=(stop,), daemon=True) for _ in range(count)]
            for worker in workers:
                worker.start()
            try:
                runs[mode].append(run_once(False, 1, repeat, args.num_blocks)["ms_per_step"])
            finally:
                stop.set()
                for worker in workers:
                    worker.join()
            print(f"{mode:6s} repeat {repeat}: {runs[mode][-1]:.3f} ms/step", flush=True)
    median = {mode: statistics.median(values) for mode, values in runs.items()}
    placed = topology(args.num_blocks) if args.topology else None
    dump(args.out, {"benchmark": "host_contention (scheduler steps beside background threads)",
                    "environment": environment(), "runs": runs, "median_ms_per_step": median,
                    "topology": placed, "argv": vars(args)})
    print()
    print(format_table(["background", "scheduler ms/step (median)", "slowdown"],
                       [[mode, median[mode], f"{median[mode] / median['none']:.2f}x"] for mode in MODES]))


if __name__ == "__main__":
    main()
