"""Probe: tokens/s the async engine's host side delivers when a null runner sleeps for each step (CPU).

The async engine's host ceiling: tokens per second through the real scheduler, GPU thread, result
hand-over and per-request streams, with a runner that "computes" each step in a fixed sleep (CPU).

    python -m benchmarks.probes.host_ceiling --streams 256 --tokens 200 --step-ms 5
    python -m benchmarks.probes.host_ceiling --streams 256 --tokens 200 --step-ms 5 --data-parallel-size 2 --no-stream
    python -m benchmarks.probes.host_ceiling --streams 256 --tokens 200 --step-ms 5 --kv-events

The model runner is replaced in this process by one that samples token 7 for every sampling request
after ``--step-ms`` of sleep (the GIL released, like a GPU wait), so the figure is what the host can
deliver when the device is never the limit: ``streams / step`` tok/s would be ideal. All requests
are consumed concurrently on one event loop, as ``dp_throughput`` and the HTTP server do. Reports
tok/s, the event-loop thread's CPU time per token, and tokens per consumer wake-up (> 1 when
consumers fall behind and take merged deltas), and the GPU thread's CPU time per token (the step loop's
host cost; ``--kv-events`` publishes KV-cache events to an ipc:// socket nobody reads, to see what they
add to it and what the publisher's own thread spends).
"""

from __future__ import annotations

import argparse
import cProfile
import random
import statistics
import tempfile
import time
from typing import Any, Optional

from benchmarks import null_runner
from benchmarks.common import SHAPES, dump, environment, format_table, write_dummy_model
from benchmarks.proc_cpu import thread_cpu


async def _run(folder: str, streams: int, tokens: int, prompt_len: int, dp: int, stream: bool,
               profile: Optional[str], kv_events: Optional[str]) -> dict[str, Any]:
    import anyio

    from aioinfer import DataParallelEngine, Engine, SamplingParams

    options = dict(load_format="dummy", device="cpu", dtype="float32", max_num_seqs=max(streams, 1),
                   max_num_batched_tokens=8192, max_waiting_requests=streams + 16,
                   num_kv_blocks=streams * ((prompt_len + tokens) // 16 + 2) + 64, block_size=16)
    if kv_events is not None:
        options["kv_events_config"] = {"enable_kv_cache_events": True, "endpoint": kv_events}
    if dp > 1:
        engine_cm = DataParallelEngine(folder, data_parallel_size=dp, **options)
    else:
        engine_cm = Engine(folder, **options)
    async with engine_cm as engine:
        rng = random.Random(0)
        got, wakes = [0], [0]
        # Only when asked: the default command line also runs against an engine without the option.
        extra = {} if stream else {"stream": False}

        async def one() -> None:
            prompt = [rng.randrange(1, 400) for _ in range(prompt_len)]
            params = SamplingParams(max_tokens=tokens, ignore_eos=True, temperature=0.0)
            async for delta in engine.generate(prompt, params, **extra):
                got[0] += len(delta.token_ids)
                wakes[0] += 1

        def spent(name: str) -> float:  # CPU seconds of the engine's threads of that (Python) name
            import threading

            tids = {t.native_id for t in threading.enumerate() if t.name == name}
            return sum(t - threads0.get(tid, (comm, 0.0))[1] for tid, (comm, t) in threads1.items() if tid in tids)

        profiler = cProfile.Profile() if profile else None
        if profiler is not None:
            profiler.enable()  # this thread only: the event loop's
        threads0 = thread_cpu()
        cpu0, t0 = time.thread_time(), time.perf_counter()
        async with anyio.create_task_group() as tg:
            for _ in range(streams):
                tg.start_soon(one)
        seconds, cpu = time.perf_counter() - t0, time.thread_time() - cpu0
        threads1 = thread_cpu()
        gpu, kv = spent("aioinfer-gpu"), spent("aioinfer-kv-events")  # read while the engine's threads live
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(profile)
    return {"tokens": got[0], "seconds": seconds, "tok_per_s": got[0] / seconds,
            "loop_cpu_us_per_token": 1e6 * cpu / got[0], "tokens_per_wake": got[0] / wakes[0],
            "gpu_thread_cpu_us_per_token": 1e6 * gpu / got[0], "kv_events_thread_cpu_us_per_token": 1e6 * kv / got[0]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--streams", type=int, default=256)
    p.add_argument("--tokens", type=int, default=200, help="output tokens per stream")
    p.add_argument("--prompt-len", type=int, default=100)
    p.add_argument("--step-ms", type=float, default=5.0, help="the null runner's time per step")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--data-parallel-size", type=int, default=1, help="replicas (DataParallelEngine when > 1)")
    p.add_argument("--no-stream", action="store_true", help="final-only delivery: generate(..., stream=False)")
    p.add_argument("--profile", default=None, help="write a cProfile of the event-loop thread (first run) here")
    p.add_argument("--kv-events", action="store_true", help="publish KV-cache events (to an ipc:// socket)")
    p.add_argument("--out", default=None)
    args = p.parse_args()

    import anyio

    null_runner.install(args.step_ms / 1e3)
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = str(write_dummy_model(SHAPES["tiny"], tmp))
        for i in range(args.repeats):
            runs.append(anyio.run(_run, folder, args.streams, args.tokens, args.prompt_len, args.data_parallel_size,
                                  not args.no_stream, args.profile if i == 0 else None,
                                  f"ipc://{tmp}/kv-events-{i}" if args.kv_events else None))
    ideal = args.streams / (args.step_ms / 1e3)
    best = max(runs, key=lambda r: r["tok_per_s"])
    median = statistics.median(r["tok_per_s"] for r in runs)
    dump(args.out, {"benchmark": "host_ceiling", "environment": environment(), "argv": vars(args),
                    "ideal_tok_per_s": ideal, "runs": runs, "median_tok_per_s": median})
    print(format_table(["replicas", "delivery", "streams", "tokens each", "step ms", "ideal tok/s", "tok/s (median)",
                        "tok/s per run", "loop CPU us/token (best run)", "tokens per wake (best run)",
                        "GPU thread CPU us/token (median)", "kv-events thread CPU us/token (median)"],
                       [[args.data_parallel_size, "final only" if args.no_stream else "stream", args.streams,
                         args.tokens, args.step_ms, ideal, median,
                         ", ".join(f"{r['tok_per_s']:,.0f}" for r in runs), best["loop_cpu_us_per_token"],
                         best["tokens_per_wake"],
                         statistics.median(r["gpu_thread_cpu_us_per_token"] for r in runs),
                         statistics.median(r["kv_events_thread_cpu_us_per_token"] for r in runs)]]))


if __name__ == "__main__":
    main()
