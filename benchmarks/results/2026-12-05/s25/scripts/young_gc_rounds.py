"""Prepared in the twenty-fifth session for the H200: workload 1 (0.5b, dummy weights, free) in one
engine, alternating runs with the young-collection threshold as landed (20,000 net allocations) and
the interpreter's own (``AIOINFER_GC_YOUNG_THRESHOLD=0``: 700), each run's ratio to the mean of the
other form's runs beside it. Per run: tok/s, ms a step, the engine thread's CPU a step, young
collections a step and their time.

    python young_gc_rounds.py --tokenizer .ab/tok [--rounds 6] [--out FILE.json]
(``SMOKE=1``: a CPU check of the script, one layer of width 32, 16 short requests.)"""
import argparse
import gc
import json
import os
import statistics
import tempfile
import time

import torch

from aioinfer import SamplingParams
from benchmarks.common import SHAPES, ModelShape, fresh_cache_salt, make_llm, workload1, write_dummy_model

p = argparse.ArgumentParser()
p.add_argument("--tokenizer", required=True)
p.add_argument("--rounds", type=int, default=6)
p.add_argument("--out", default=None)
args = p.parse_args()
smoke = os.environ.get("SMOKE") == "1"
shape = ModelShape("probe", 1, 32, 2, 1, 16, 64, 151936, True) if smoke else SHAPES["qwen2.5-0.5b"]
device = "cpu" if smoke else "cuda"
llm, _ = make_llm(str(write_dummy_model(shape, tempfile.mkdtemp())), device, None, None, max_model_len=2048,
                  max_num_seqs=256, max_num_batched_tokens=8192, tokenizer=args.tokenizer,
                  **({"async_scheduling": True} if smoke else {"gpu_memory_utilization": 0.9}))
engine = llm.engine
requests = workload1(max_token_id=10000)
if smoke:
    requests = [type(r)(r.prompt[:20], 8) for r in requests[:16]]
young = [0, 0.0]  # young collections (generations 0 and 1), their seconds
_started = [0.0]


def _count(phase, info):
    if info["generation"] == 2:
        return
    if phase == "start":
        _started[0] = time.perf_counter()
    else:
        young[0] += 1
        young[1] += time.perf_counter() - _started[0]


gc.callbacks.append(_count)


def run(form: str) -> dict:
    if form == "interpreter":
        os.environ["AIOINFER_GC_YOUNG_THRESHOLD"] = "0"
    else:
        os.environ.pop("AIOINFER_GC_YOUNG_THRESHOLD", None)
    params = [SamplingParams(max_tokens=r.max_tokens, ignore_eos=True, temperature=0.0) for r in requests]
    steps, counted = engine.num_steps, list(young)
    if not smoke:
        torch.cuda.synchronize()
    cpu, start = time.thread_time(), time.perf_counter()
    outs = llm.generate([r.prompt for r in requests], params, use_tqdm=False, cache_salt=fresh_cache_salt())
    if not smoke:
        torch.cuda.synchronize()
    seconds, cpu = time.perf_counter() - start, time.thread_time() - cpu
    steps = max(1, engine.num_steps - steps)
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    return {"form": form, "tok_per_s": tokens / seconds, "ms_per_step": 1e3 * seconds / steps,
            "engine_cpu_ms_per_step": 1e3 * cpu / steps, "young_per_step": (young[0] - counted[0]) / steps,
            "young_ms_per_step": 1e3 * (young[1] - counted[1]) / steps}


run("landed"), run("interpreter")  # warm: kernels built for the batch's shapes
runs = []
for round_ in range(args.rounds):
    for form in (("landed", "interpreter") if round_ % 2 == 0 else ("interpreter", "landed")):
        runs.append({"round": round_, **run(form)})
        r = runs[-1]
        print(f"round {round_} {form:>11}: {r['tok_per_s']:9,.0f} tok/s  {r['ms_per_step']:.3f} ms/step  engine cpu "
              f"{r['engine_cpu_ms_per_step']:.3f}  young {r['young_per_step']:.2f}/step {r['young_ms_per_step']:.3f} ms",
              flush=True)
runs.append({"round": args.rounds, **run("landed")})
ratios = []
for i, r in enumerate(runs):
    if r["form"] == "landed":
        beside = [runs[j]["tok_per_s"] for j in (i - 1, i + 1) if 0 <= j < len(runs) and runs[j]["form"] == "interpreter"]
        if beside:
            ratios.append(r["tok_per_s"] / statistics.mean(beside))
summary = {form: {key: statistics.median(r[key] for r in runs if r["form"] == form)
                  for key in ("tok_per_s", "ms_per_step", "engine_cpu_ms_per_step", "young_per_step", "young_ms_per_step")}
           for form in ("landed", "interpreter")}
summary["landed_over_interpreter"] = {"median": statistics.median(ratios), "ratios": [round(x, 3) for x in ratios]}
print(json.dumps(summary, indent=1))
if args.out:
    with open(args.out, "w") as f:
        json.dump({"summary": summary, "runs": runs}, f, indent=1)
llm.shutdown()
