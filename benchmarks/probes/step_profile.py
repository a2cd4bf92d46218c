"""Probe: where a step's time goes, host phases and device kernels of decode (and one prefill) steps.

    python -m benchmarks.probes.step_profile --model qwen2.5-7b --batches 1,64 --steps 32 --out profile.json

For each batch size, generates ``--steps`` decode tokens from ``--prompt-len``-token prompts through
the public ``LLM`` API under ``torch.profiler`` and reports per decode step:

- wall time per step (from an unprofiled run of the same shape, so profiler overhead is excluded);
- device busy time (union of kernel intervals) and the sum of kernel times;
- host time of the engine phases (schedule, launch, collect, update, output processing), measured
  by wrapping those methods in ``record_function`` ranges for the profiled run only;
- the kernels with the largest total time, with their count per step.

``--prefill-tokens N`` also profiles the step that prefills one N-token prompt (the shape of the
mixed steps of workload 1). Profiles are what docs/performance.md quotes when a target is missed.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections import defaultdict
from typing import Any

from benchmarks.common import (default_device, SHAPES, add_engine_options, dump, engine_options, environment, format_table,
                               fresh_cache_salt, make_llm, workload2, write_dummy_model)

_PHASES = {  # label -> (attribute path on the LLM, method name)
    "schedule": ("engine.scheduler", "schedule"),
    "launch": ("engine.executor.runner", "launch"),
    "collect": ("engine.executor.runner", "collect"),
    "update": ("engine.scheduler", "update"),
    "step (all)": ("engine", "step_with_details"),
}


def _wrap_phases(llm) -> None:
    """Put each engine phase in a named profiler range (instance attributes: no global patching)."""
    import torch

    for label, (path, name) in _PHASES.items():
        owner = llm
        for part in path.split("."):
            owner = getattr(owner, part)
        method = getattr(owner, name)

        def wrapped(*args, _method=method, _label=label, **kwargs):
            with torch.profiler.record_function(f"phase::{_label}"):
                return _method(*args, **kwargs)

        setattr(owner, name, wrapped)


def _union_us(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


def _analyse(prof, num_steps: int, top: int) -> dict[str, Any]:
    from torch.autograd import DeviceType

    kernels: dict[str, list[float]] = defaultdict(list)
    intervals: list[tuple[float, float]] = []
    phases: dict[str, float] = defaultdict(float)
    for evt in prof.events():
        if evt.name.startswith("phase::") and evt.device_type == DeviceType.CUDA:
            continue  # the GPU-side shadow of a record_function range, not a kernel
        if evt.device_type == DeviceType.CUDA:
            kernels[evt.name].append(evt.time_range.elapsed_us())
            intervals.append((evt.time_range.start, evt.time_range.end))
        elif evt.name.startswith("phase::"):
            phases[evt.name[len("phase::"):]] += evt.time_range.elapsed_us()
    rows = sorted(((name, sum(ts), len(ts)) for name, ts in kernels.items()), key=lambda r: -r[1])
    return {
        "device_busy_us_per_step": _union_us(intervals) / num_steps,
        "kernel_sum_us_per_step": sum(r[1] for r in rows) / num_steps,
        "kernels_per_step": sum(r[2] for r in rows) / num_steps,
        "host_phase_us_per_step": {k: v / num_steps for k, v in phases.items()},
        "top_kernels": [{"name": n[:90], "us_per_step": t / num_steps, "calls_per_step": c / num_steps}
                        for n, t, c in rows[:top]],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=sorted(SHAPES), default="qwen2.5-0.5b")
    p.add_argument("--batches", default="1,64")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--steps", type=int, default=32, help="decode steps profiled per batch size")
    p.add_argument("--prefill-tokens", type=int, default=0, help="also profile one prefill of this many tokens")
    p.add_argument("--top", type=int, default=12)
    p.add_argument("--enforce-eager", choices=("true", "false"), default=None)
    p.add_argument("--async-scheduling", choices=("true", "false"), default=None)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    p.add_argument("--device", default=None)
    p.add_argument("--out", default=None)
    add_engine_options(p)
    args = p.parse_args()

    import torch
    from torch.profiler import ProfilerActivity, profile

    from aioinfer import SamplingParams

    device = default_device(args.device)
    shape = SHAPES[args.model]
    batches = [int(b) for b in args.batches.split(",")]
    tok_max = min(10000, shape.vocab - 1)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    env = environment()
    print(env, flush=True)

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_dummy_model(shape, tmp)
        max_len = max(args.prompt_len + args.steps + 16, args.prefill_tokens + 16)
        llm, _ = make_llm(folder, device, None if args.enforce_eager is None else args.enforce_eager == "true",
                          None, max_model_len=max_len, max_num_seqs=max(batches),
                          max_num_batched_tokens=max(8192, args.prefill_tokens),
                          gpu_memory_utilization=args.gpu_memory_utilization, **engine_options(args),
                          **({} if args.async_scheduling is None
                             else {"async_scheduling": args.async_scheduling == "true"}))

        def run(prompts, max_tokens: int) -> float:
            params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0)
            sync()
            start = time.perf_counter()
            llm.generate(prompts, params, use_tqdm=False, cache_salt=fresh_cache_salt())
            sync()
            return time.perf_counter() - start

        for batch in batches:
            prompts = [r.prompt for r in workload2(batch, args.prompt_len, args.steps, max_token_id=tok_max)]
            run(prompts, 8)
            # Unprofiled wall time per decode step, as decode_latency measures it.
            t1 = statistics.median(run(prompts, 1) for _ in range(3))
            tn = statistics.median(run(prompts, args.steps + 1) for _ in range(3))
            wall_us = (tn - t1) / args.steps * 1e6
            results[f"decode batch {batch}"] = {"wall_us_per_step": wall_us, "profile": None}
        _wrap_phases(llm)
        for batch in batches:
            prompts = [r.prompt for r in workload2(batch, args.prompt_len, args.steps, max_token_id=tok_max)]
            run(prompts, 1)  # the prefill outside the profiled window is not separable: profile T(steps+1)
            with profile(activities=activities) as prof:
                run(prompts, args.steps + 1)
            # steps + 1 engine steps ran (one prefill): report per step over all of them, and keep the
            # prefill's share small by profiling many decode steps.
            results[f"decode batch {batch}"]["profile"] = _analyse(prof, args.steps + 1, args.top)
        if args.prefill_tokens:
            prompt = [r.prompt for r in workload2(1, args.prefill_tokens, 1, max_token_id=tok_max)]
            run(prompt, 1)
            wall_us = statistics.median(run(prompt, 1) for _ in range(3)) * 1e6
            with profile(activities=activities) as prof:
                run(prompt, 1)
            results[f"prefill {args.prefill_tokens}"] = {"wall_us_per_step": wall_us,
                                                         "profile": _analyse(prof, 1, args.top)}

    dump(args.out, {"benchmark": "step_profile", "model": args.model, "environment": env, "results": results,
                    "argv": vars(args)})
    for name, res in results.items():
        prof = res["profile"]
        print(f"\n{args.model} {name}: wall {res['wall_us_per_step']:.0f} us/step (unprofiled); "
              f"device busy {prof['device_busy_us_per_step']:.0f} us, kernel sum {prof['kernel_sum_us_per_step']:.0f} us,"
              f" {prof['kernels_per_step']:.0f} kernels/step (profiled)")
        print("host phases us/step: " + ", ".join(f"{k} {v:.0f}" for k, v in prof["host_phase_us_per_step"].items()))
        print(format_table(["kernel", "us/step", "calls/step"],
                           [[k["name"], k["us_per_step"], k["calls_per_step"]] for k in prof["top_kernels"]]))


if __name__ == "__main__":
    main()
