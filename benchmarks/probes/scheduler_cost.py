"""Probe: host cost of the scheduler alone on workload 1, without and with random priorities (CPU, no model).

    python -m benchmarks.probes.scheduler_cost --repeats 2
    python -m benchmarks.probes.scheduler_cost --repeats 5 --kv-events

Drives ``Scheduler`` + ``KVCacheManager`` (prefix caching on, a pool that never runs short, the
engine's default budgets) through workload 1's 256 requests with a runner that answers every
sampling request at once; times ``schedule`` + ``update`` per step. "none" puts every request at
priority 0, "random" draws one per request from [0, ``--levels``); runs interleave. It shows what
priorities cost the host per step and how many requests they preempt; the GPU throughput cost is
``benchmarks/probes/priority_cost.py``'s. ``--kv-events`` compares instead KV-cache event recording
off and on (no priorities; on, the step also takes the events, as the engine core does before it hands
them to its publisher's thread): the GPU thread's share of the feature.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Any

from benchmarks.common import dump, environment, format_table, workload1


def run_once(priorities: bool, levels: int, seed: int, num_blocks: int, kv_events: bool = False) -> dict[str, Any]:
    from aioinfer.config import SchedulerConfig
    from aioinfer.core.kv_cache_manager import KVCacheManager
    from aioinfer.core.scheduler import Scheduler
    from aioinfer.core.scheduler_output import RunnerOutput
    from aioinfer.request import Request
    from aioinfer.sampling_params import SamplingParams

    kv = KVCacheManager(num_blocks, 16, enable_prefix_caching=True, model_identity="scheduler-cost",
                        kv_events=kv_events)
    scheduler = Scheduler(SchedulerConfig(), kv, max_model_len=2048)
    rng = random.Random(seed)
    for i, r in enumerate(workload1(num_requests=256, seed=0)):
        scheduler.add_request(Request(
            request_id=str(i), prompt_token_ids=list(r.prompt), max_tokens=r.max_tokens,
            sampling_params=SamplingParams(max_tokens=r.max_tokens, ignore_eos=True),
            priority=rng.randrange(levels) if priorities else 0))
    seconds, steps, events = 0.0, 0, 0
    while scheduler.has_unfinished():
        start = time.perf_counter()
        out = scheduler.schedule()
        ids = [s.request_id for s in out.scheduled if s.samples]
        scheduler.update(out, RunnerOutput(sampled_request_ids=ids, sampled_token_ids=[7] * len(ids)))
        if kv.events is not None:
            events += len(kv.events.take())
        seconds += time.perf_counter() - start
        steps += 1
    return {"steps": steps, "seconds": seconds, "ms_per_step": 1e3 * seconds / steps,
            "preemptions": scheduler.num_preemptions, "priority_preemptions": scheduler.num_priority_preemptions,
            "kv_events": events}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=2, help="runs of each mode (the first pair warms up Python)")
    p.add_argument("--levels", type=int, default=10)
    p.add_argument("--num-blocks", type=int, default=20000, help="KV blocks of 16 tokens (workload 1 needs ~17k)")
    p.add_argument("--kv-events", action="store_true", help="compare KV-cache event recording off and on instead")
    p.add_argument("--out", default=None)
    args = p.parse_args()

    modes = ("kv events off", "kv events on") if args.kv_events else ("none", "random")
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
    for rep in range(args.repeats):
        for mode in runs:
            runs[mode].append(run_once(mode == "random", args.levels, rep, args.num_blocks,
                                       kv_events=mode == "kv events on"))
            print(mode, runs[mode][-1], flush=True)
    median = {mode: statistics.median(r["ms_per_step"] for r in rs) for mode, rs in runs.items()}
    dump(args.out, {"benchmark": "scheduler_cost (workload 1, host only)", "environment": environment(),
                    "runs": runs, "median_ms_per_step": median, "argv": vars(args)})
    print()
    print(format_table(["kv-cache events" if args.kv_events else "priorities", "steps", "host ms/step (median)", "preemptions", "of which for priority"], [
        [mode, rs[-1]["steps"], median[mode], rs[-1]["preemptions"], rs[-1]["priority_preemptions"]]
        for mode, rs in runs.items()]))


if __name__ == "__main__":
    main()
