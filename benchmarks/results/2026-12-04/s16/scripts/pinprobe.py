"""Sixteenth session, a probe: does the constrained engine thread lose its CPU time to GIL turns
that cross cores? Forms in one engine (workload 1, 0.5b dummy, free-strings schema), each a
(free, constrained, free) triple per round in one pinning state:

  unpinned   as landed: the OS places every thread
  same_core  the engine (main) thread and the grammar worker thread pinned to one CPU; llguidance's
             pool made on the other CPUs (so the worker's GIL turns never cross cores)
  engine_only  the engine thread pinned to that CPU; worker and pool on the others

Per run: tok/s, ms a step, engine CPU ms a step, and CPU ms a step inside the wrapped phases.
    python pinprobe.py --tokenizer DIR [--rounds 4] [--cpu 3] [--out F.json]
"""
import argparse
import collections
import json
import os
import statistics
import tempfile
import time

import torch

from aioinfer import SamplingParams
from aioinfer.core.scheduler import Scheduler
from aioinfer.engine.engine_core import EngineCore
from aioinfer.engine.output_processor import OutputProcessor
from aioinfer.entrypoints.llm_metrics import OfflineMetrics
from aioinfer.structured_output import StructuredOutputsParams
from aioinfer.worker import grammar_worker, model_runner
from aioinfer.worker.grammar_mask import GrammarMasks
from aioinfer.worker.grammar_worker import GrammarWorker
from benchmarks.common import SHAPES, fresh_cache_salt, make_llm, workload1, write_dummy_model
from benchmarks.offline_throughput import STRUCTURED_SCHEMAS

CPU = collections.Counter()
PHASES = [(EngineCore, "step_with_details"), (Scheduler, "schedule"), (Scheduler, "update"),
          (model_runner.ModelRunner, "prepare"), (model_runner.ModelRunner, "run"),
          (model_runner.ModelRunner, "finish"), (model_runner.ModelRunner, "collect"),
          (OutputProcessor, "process"), (OfflineMetrics, "record_step"), (GrammarMasks, "apply")]


def _wrap(cls, name):
    fn, label = getattr(cls, name), f"{cls.__name__}.{name}"

    def timed(*a, **k):
        c = time.thread_time()
        try:
            return fn(*a, **k)
        finally:
            CPU[label] += time.thread_time() - c
    setattr(cls, name, timed)


for cls, name in PHASES:
    _wrap(cls, name)

landed_serve = grammar_worker._serve
OWN_CPU = [None]  # the worker thread's own CPU after it made the executor (None: stay on the pool's)


def serve(jobs, threads, cpus, handoff, ready, made):
    if OWN_CPU[0] is not None:
        own = OWN_CPU[0]

        class Ready:  # pin this thread once the executor (and its pool) exists, before the first job
            def set(self):
                os.sched_setaffinity(0, {own})
                ready.set()
        return landed_serve(jobs, threads, cpus, handoff, Ready(), made)
    return landed_serve(jobs, threads, cpus, handoff, ready, made)


grammar_worker._serve = serve


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--cpu", type=int, default=3)
    p.add_argument("--forms", default="unpinned,same_core,engine_only")
    p.add_argument("--out")
    p.add_argument("--device", default="cuda")
    p.add_argument("--num-requests", type=int, default=256)
    args = p.parse_args()
    shape = SHAPES["qwen2.5-0.5b"]
    folder = write_dummy_model(shape, tempfile.mkdtemp())
    llm, _ = make_llm(str(folder), args.device, None, None, max_model_len=2048, max_num_seqs=256,
                      max_num_batched_tokens=8192, gpu_memory_utilization=0.9, tokenizer=args.tokenizer)
    engine = llm.engine
    masks = engine.runner.grammar_masks
    all_cpus = os.sched_getaffinity(0)
    others = all_cpus - {args.cpu}
    constraint = StructuredOutputsParams(json=STRUCTURED_SCHEMAS["strings"])

    def set_form(form):
        if masks._worker is not None:
            masks._worker.close()
            masks._worker = None
        if form == "unpinned":
            os.sched_setaffinity(0, all_cpus)
            masks._cpus, OWN_CPU[0] = all_cpus, None
        elif form == "same_core":
            os.sched_setaffinity(0, {args.cpu})
            masks._cpus, OWN_CPU[0] = others, args.cpu
        elif form == "engine_only":
            os.sched_setaffinity(0, {args.cpu})
            masks._cpus, OWN_CPU[0] = others, None

    def timed(requests, constrained):
        params = [SamplingParams(max_tokens=r.max_tokens, ignore_eos=True, temperature=0.0,
                                 structured_outputs=constraint if constrained else None) for r in requests]
        steps, rejected, fill_s, fills = engine.num_steps, masks.num_rejected, masks.fill_seconds, masks.num_fills
        before = dict(CPU)
        sync()
        cpu, start = time.thread_time(), time.perf_counter()
        outs = llm.generate([r.prompt for r in requests], params, use_tqdm=False, cache_salt=fresh_cache_salt())
        sync()
        seconds, cpu = time.perf_counter() - start, time.thread_time() - cpu
        tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        steps = max(1, engine.num_steps - steps)
        return {"tok_per_s": tokens / seconds, "ms_per_step": 1e3 * seconds / steps,
                "cpu_ms_per_step": 1e3 * cpu / steps, "rejected": masks.num_rejected - rejected,
                "fill_ms": 1e3 * (masks.fill_seconds - fill_s) / max(1, masks.num_fills - fills),
                "phases": {k: round(1e3 * (v - before.get(k, 0.0)) / steps, 4) for k, v in CPU.items()}}

    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    forms = args.forms.split(",")
    warm = workload1(num_requests=4, seed=1, max_input_len=200, max_output_len=110, max_token_id=500)
    if args.device == "cpu":
        warm = workload1(num_requests=2, seed=1, max_input_len=120, max_output_len=120, max_token_id=500)
    requests = workload1(max_token_id=10000)[:args.num_requests]
    for form in forms:
        set_form(form)
        timed(warm, False), timed(warm, True)
    set_form("unpinned")
    timed(requests, False), timed(requests, True)
    runs = []
    for rnd in range(args.rounds):
        turn = rnd % len(forms)
        for form in forms[turn:] + forms[:turn]:
            set_form(form)
            triple = [timed(requests, False), timed(requests, True), timed(requests, False)]
            ratio = triple[1]["tok_per_s"] / statistics.mean((triple[0]["tok_per_s"], triple[2]["tok_per_s"]))
            runs.append({"round": rnd, "form": form, "ratio": ratio, "free": [triple[0], triple[2]], "cons": triple[1]})
            print(f"round {rnd} {form:>12}: ratio {ratio:.3f}  free {triple[0]['tok_per_s']:,.0f}/{triple[2]['tok_per_s']:,.0f}"
                  f" ({triple[0]['ms_per_step']:.2f} ms, cpu {triple[0]['cpu_ms_per_step']:.2f})  cons {triple[1]['tok_per_s']:,.0f}"
                  f" ({triple[1]['ms_per_step']:.2f} ms, cpu {triple[1]['cpu_ms_per_step']:.2f}, fill {triple[1]['fill_ms']:.2f},"
                  f" rej {triple[1]['rejected']})", flush=True)
    set_form("unpinned")
    summary = {}
    for form in forms:
        mine = [r for r in runs if r["form"] == form]
        med = statistics.median
        free = [f for r in mine for f in r["free"]]
        cons = [r["cons"] for r in mine]
        summary[form] = {"ratio_median": med(r["ratio"] for r in mine), "ratios": [round(r["ratio"], 3) for r in mine],
                         "free_ms": med(f["ms_per_step"] for f in free), "free_cpu": med(f["cpu_ms_per_step"] for f in free),
                         "cons_ms": med(c["ms_per_step"] for c in cons), "cons_cpu": med(c["cpu_ms_per_step"] for c in cons),
                         "rejected": sum(c["rejected"] for c in cons),
                         "free_phases": {k: med(f["phases"].get(k, 0) for f in free) for k in CPU},
                         "cons_phases": {k: med(c["phases"].get(k, 0) for c in cons) for k in CPU}}
    print(f"{'form':>12} {'ratio':>6} {'free ms':>7} {'cpu':>5} {'cons ms':>7} {'cpu':>5} rej  ratios")
    for form, s in summary.items():
        print(f"{form:>12} {s['ratio_median']:6.3f} {s['free_ms']:7.3f} {s['free_cpu']:5.2f} {s['cons_ms']:7.3f} "
              f"{s['cons_cpu']:5.2f} {s['rejected']:3d}  {s['ratios']}")
    print("phase CPU ms/step (free -> constrained):")
    for k in CPU:
        print(f"  {k:32s} " + "  ".join(f"{form}: {s['free_phases'][k]:.3f} -> {s['cons_phases'][k]:.3f}"
                                        for form, s in summary.items()))
    if args.out:
        json.dump({"summary": summary, "runs": runs}, open(args.out, "w"), indent=1)
    llm.shutdown()


if __name__ == "__main__":
    main()
