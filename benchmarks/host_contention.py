"""Does the engine thread's Python run slower while other threads work, and which kind of work?
(docs/performance.md, "Tenth session": beside llguidance's mask fill, the constrained 0.5b engine
thread's ordinary scheduling code ran 40-75 % slower.)

    python -m benchmarks.host_contention --tokenizer FOLDER [--threads 12] [--repeats 3]

The main thread runs the scheduler's real per-step work (``Scheduler.schedule`` + ``update`` on
workload 1's 256 requests, as ``benchmarks/scheduler_cost.py``) while background threads, which
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
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import threading
from typing import Any, Callable

import numpy as np

from benchmarks.common import dump, environment, format_table
from benchmarks.scheduler_cost import run_once

MODES = ("none", "hash", "copy", "masks")


def _hash_load(stop: threading.Event) -> None:
    while not stop.is_set():
        hashlib.pbkdf2_hmac("sha256", b"password", b"salt", 50_000)


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
    dump(args.out, {"benchmark": "host_contention (scheduler steps beside background threads)",
                    "environment": environment(), "runs": runs, "median_ms_per_step": median, "argv": vars(args)})
    print()
    print(format_table(["background", "scheduler ms/step (median)", "slowdown"],
                       [[mode, median[mode], f"{median[mode] / median['none']:.2f}x"] for mode in MODES]))


if __name__ == "__main__":
    main()
