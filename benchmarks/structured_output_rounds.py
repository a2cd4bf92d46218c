"""Constrained against unconstrained throughput in one engine, in alternating rounds: workload 1
(dummy weights) free, then with every request constrained by a JSON schema, then free again, ...

    python -m benchmarks.structured_output_rounds --tokenizer FOLDER [--model qwen2.5-0.5b]
        [--rounds 4] [--schema strings] [--variant NAME ...] [--out FILE.json]

Every constrained run sits between two free ones (the forms' order turned each round), and its
ratio is to their mean. One engine for every run, so that the machine's drift between engines
(the H200 host gave 41.7-60.8k tok/s for the same free run within an hour) falls on both sides of
each ratio alike; every run has a fresh prefix-cache salt. Per run: tok/s, engine steps, the
engine thread's CPU ms per step and the grammar worker's advance + masks ms per step. The ratio
reported is the median over rounds.

``--variant`` adds constrained runs of another form in every round, for an A/B in one engine: a
variant is a function in ``VARIANTS`` that patches the engine for its run and returns the undo.
A probe's own timers go in ``COUNTERS`` (name -> its running total in seconds), reported per run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from typing import Any, Callable

import torch

from aioinfer import SamplingParams
from aioinfer.structured_output import StructuredOutputsParams
from benchmarks.common import SHAPES, default_device, fresh_cache_salt, make_llm, workload1, write_dummy_model
from benchmarks.offline_throughput import STRUCTURED_SCHEMAS

# name -> patch(engine) returning an undo; registered by scripts that import this module.
VARIANTS: dict[str, Callable[[Any], Callable[[], None]]] = {}
# name -> a running total in seconds (a probe's own timer), reported per run as ms a step.
COUNTERS: dict[str, Callable[[], float]] = {}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=sorted(SHAPES), default="qwen2.5-0.5b")
    p.add_argument("--tokenizer", required=True, help="a tokenizer folder for the shape's vocabulary")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--schema", choices=sorted(STRUCTURED_SCHEMAS), default="strings")
    p.add_argument("--variant", action="append", default=[], help="a name in VARIANTS (repeatable)")
    p.add_argument("--num-requests", type=int, default=256)
    p.add_argument("--max-input-len", type=int, default=1024, help="prompt lengths uniform in [100, this]")
    p.add_argument("--max-output-len", type=int, default=1024, help="output lengths uniform in [100, this]")
    p.add_argument("--device", default=None)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    summary = run(args)["summary"]
    print(json.dumps(summary, indent=1))
    print(_table(summary, ["constrained", *args.variant]))


def _table(summary: dict[str, Any], forms: list[str]) -> str:
    """The summary as the table printed last: each form against the free runs beside it."""
    from benchmarks.common import format_table

    rows = [[form, summary[form]["ratio_median"], " ".join(f"{x:.3f}" for x in summary[form]["ratios"]),
             summary[form]["tok_per_s_median"], summary[form]["ms_per_step"], summary[form]["worker_ms_per_step"],
             summary[form]["rejected_tokens"]] for form in forms]
    rows.append(["free", None, None, summary["free"]["tok_per_s_median"], summary["free"]["ms_per_step"], None, None])
    return format_table(["form", "ratio to free (median)", "ratios", "tok/s (median)", "ms/step", "worker ms/step",
                         "rejected tokens"], rows)


def run(args) -> dict[str, Any]:
    device = default_device(args.device)
    shape = SHAPES[args.model]
    folder = write_dummy_model(shape, tempfile.mkdtemp())
    llm, _ = make_llm(str(folder), device, None, None, max_model_len=2048, max_num_seqs=256,
                      max_num_batched_tokens=8192, gpu_memory_utilization=0.9, tokenizer=args.tokenizer)
    engine = llm.engine
    masks = engine.executor.runner.grammar_masks
    constraint = StructuredOutputsParams(json=STRUCTURED_SCHEMAS[args.schema])

    def timed(requests, constrained: bool) -> dict[str, float]:
        params = [SamplingParams(max_tokens=r.max_tokens, ignore_eos=True, temperature=0.0,
                                 structured_outputs=constraint if constrained else None) for r in requests]
        fill_s, fills, steps = masks.fill_seconds, masks.num_fills, engine.num_steps
        copy_start_s, wait_s, rejected = masks.copy_start_seconds, masks.wait_seconds, masks.num_rejected
        counted = {name: read() for name, read in COUNTERS.items()}
        _sync(device)
        cpu, start = time.thread_time(), time.perf_counter()
        outs = llm.generate([r.prompt for r in requests], params, use_tqdm=False, cache_salt=fresh_cache_salt())
        _sync(device)
        seconds, cpu = time.perf_counter() - start, time.thread_time() - cpu
        tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        steps = max(1, engine.num_steps - steps)
        return {"tok_per_s": tokens / seconds, "tokens": tokens, "steps": steps,
                "ms_per_step": 1e3 * seconds / steps, "engine_cpu_ms_per_step": 1e3 * cpu / steps,
                "worker_ms_per_step": (1e3 * (masks.fill_seconds - fill_s) / (masks.num_fills - fills)
                                       if masks.num_fills > fills else 0.0),
                # from masks computed to their copy started (the engine thread's poll; 280aae6: the worker waiting for the GIL)
                "copy_start_ms_per_step": (1e3 * (masks.copy_start_seconds - copy_start_s) / (masks.num_fills - fills)
                                           if masks.num_fills > fills else 0.0),
                "engine_wait_ms_per_step": 1e3 * (masks.wait_seconds - wait_s) / steps,
                "rejected_tokens": masks.num_rejected - rejected,  # 0 unless a mask was wrong
                **{f"{name}_ms_per_step": 1e3 * (read() - counted[name]) / steps for name, read in COUNTERS.items()}}

    warm = workload1(num_requests=4, seed=1, max_input_len=200, max_output_len=110, max_token_id=500)
    timed(warm, False), timed(warm, True)
    requests = workload1(max_input_len=args.max_input_len, max_output_len=args.max_output_len,
                         max_token_id=min(10000, shape.vocab - 1))[: args.num_requests]
    # Once each at full size, untimed: the first such runs were 20-40 % slower on both sides (kernels
    # built for the batch's shapes), which the first round's ratios then carried.
    timed(requests, False), timed(requests, True)
    forms = ["constrained"] + list(args.variant)
    runs: list[dict[str, Any]] = []
    for round_ in range(args.rounds):
        # Every constrained run between two free ones, and the forms' order turned each round: the
        # host's speed drifts within seconds, so each ratio is to the free runs beside it.
        turn = round_ % len(forms)
        for form in forms[turn:] + forms[:turn]:
            runs.append({"round": round_, "form": "free", **timed(requests, False)})
            print(_line(runs[-1]), flush=True)
            undo = VARIANTS[form](engine) if form != "constrained" else (lambda: None)
            try:
                runs.append({"round": round_, "form": form, **timed(requests, True)})
            finally:
                undo()
            print(_line(runs[-1]), flush=True)
    runs.append({"round": args.rounds, "form": "free", **timed(requests, False)})
    print(_line(runs[-1]), flush=True)

    summary: dict[str, Any] = {"model": args.model, "schema": args.schema, "rounds": args.rounds}
    for form in forms:
        ratios = [r["tok_per_s"] / statistics.mean((runs[i - 1]["tok_per_s"], runs[i + 1]["tok_per_s"]))
                  for i, r in enumerate(runs) if r["form"] == form]
        mine = [r for r in runs if r["form"] == form]
        summary[form] = {"ratio_median": statistics.median(ratios), "ratios": [round(x, 3) for x in ratios],
                         "tok_per_s_median": statistics.median(r["tok_per_s"] for r in mine),
                         "worker_ms_per_step": statistics.median(r["worker_ms_per_step"] for r in mine),
                         "copy_start_ms_per_step": statistics.median(r["copy_start_ms_per_step"] for r in mine),
                         "engine_wait_ms_per_step": statistics.median(r["engine_wait_ms_per_step"] for r in mine),
                         "engine_cpu_ms_per_step": statistics.median(r["engine_cpu_ms_per_step"] for r in mine),
                         "ms_per_step": statistics.median(r["ms_per_step"] for r in mine),
                         "rejected_tokens": sum(r["rejected_tokens"] for r in mine), **_counters(mine)}
    free = [r for r in runs if r["form"] == "free"]
    summary["free"] = {"tok_per_s_median": statistics.median(r["tok_per_s"] for r in free),
                       "engine_cpu_ms_per_step": statistics.median(r["engine_cpu_ms_per_step"] for r in free),
                       "ms_per_step": statistics.median(r["ms_per_step"] for r in free), **_counters(free)}
    result = {"summary": summary, "runs": runs}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    llm.shutdown()
    return result


def _counters(runs: list[dict[str, Any]]) -> dict[str, float]:
    """The ``COUNTERS``' medians over runs."""
    return {f"{name}_ms_per_step": statistics.median(r[f"{name}_ms_per_step"] for r in runs) for name in COUNTERS}


def _line(r: dict[str, Any]) -> str:
    return (f"round {r['round']} {r['form']:>14}: {r['tok_per_s']:9,.0f} tok/s  {r['steps']:5d} steps  "
            f"{r['ms_per_step']:.3f} ms/step  engine cpu {r['engine_cpu_ms_per_step']:.3f}  "
            f"worker {r['worker_ms_per_step']:.3f} (copy start {r['copy_start_ms_per_step']:.3f}) "
            f"engine wait {r['engine_wait_ms_per_step']:.3f} ms/step")


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
