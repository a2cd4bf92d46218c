"""Probe: the engine thread's time per step phase with every request JSON-constrained, against free.

Where a step goes with every request constrained: workload 1 (dummy weights) on one engine, the
engine thread's wall and CPU time per step by phase (schedule, launch, finish = wait for the masks +
apply + sample, collect, update), and the worker thread's advance + fill.

    python -m benchmarks.probes.structured_output_phases --kind json|free|json-serial [--model qwen2.5-0.5b]
        --tokenizer FOLDER [--repeats 2]

``json-serial`` advances the matchers one by one in Python (the form before ``consume_token_par``),
for an A/B in one call. Diagnostic: the phases are timed by wrapping the methods (a few µs a call).
"""

from __future__ import annotations

import argparse
import collections
import tempfile
import time

import torch

from aioinfer import SamplingParams
from aioinfer.core.scheduler import Scheduler
from aioinfer.engine.engine_core import EngineCore
from aioinfer.structured_output import StructuredOutputsParams
from aioinfer.worker import model_runner
from aioinfer.structured_output.grammar_mask import GrammarMasks
from benchmarks.common import SHAPES, default_device, fresh_cache_salt, make_llm, workload1, write_dummy_model
from benchmarks.offline_throughput import STRUCTURED_SCHEMAS

PHASES = [(EngineCore, "step_with_details"), (Scheduler, "schedule"), (Scheduler, "update"),
          (model_runner.ModelRunner, "launch"), (model_runner.ModelRunner, "finish"),
          (model_runner.ModelRunner, "collect"), (model_runner.ModelRunner, "_sample"),
          (GrammarMasks, "finish_fill"), (GrammarMasks, "apply"), (GrammarMasks, "plan"),
          (GrammarMasks, "start"), (GrammarMasks, "advance"), (model_runner.ModelRunner, "prepare"),
          (model_runner.ModelRunner, "run")]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kind", choices=("json", "free", "json-serial"), required=True)
    p.add_argument("--model", choices=sorted(SHAPES), default="qwen2.5-0.5b")
    p.add_argument("--tokenizer", required=True, help="a tokenizer folder for the shape's vocabulary")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--num-requests", type=int, default=256)
    p.add_argument("--device", default=None)
    args = p.parse_args()

    wall, cpu, calls = collections.Counter(), collections.Counter(), collections.Counter()
    for cls, name in PHASES:
        _time_calls(cls, name, wall, cpu, calls)
    if args.kind == "json-serial":
        def advance_one_by_one(self, rows):
            for state, token_id in rows:
                model_runner._advance(state, [token_id])
        GrammarMasks.advance = advance_one_by_one

    device = default_device(args.device)
    shape = SHAPES[args.model]
    folder = write_dummy_model(shape, tempfile.mkdtemp())
    llm, _ = make_llm(str(folder), device, None, None, max_model_len=2048, max_num_seqs=256,
                      max_num_batched_tokens=8192, gpu_memory_utilization=0.9, tokenizer=args.tokenizer)
    constraint = (StructuredOutputsParams(json=STRUCTURED_SCHEMAS["strings"]) if args.kind != "free" else None)

    def run(requests) -> tuple[int, float]:
        params = [SamplingParams(max_tokens=r.max_tokens, ignore_eos=True, temperature=0.0,
                                 structured_outputs=constraint) for r in requests]
        _sync(device)
        start = time.perf_counter()
        outs = llm.generate([r.prompt for r in requests], params, use_tqdm=False, cache_salt=fresh_cache_salt())
        _sync(device)
        return sum(len(o.outputs[0].token_ids) for o in outs), time.perf_counter() - start

    run(workload1(num_requests=4, seed=1, max_input_len=200, max_output_len=110, max_token_id=500))
    requests = workload1(max_token_id=min(10000, shape.vocab - 1))[: args.num_requests]
    masks = llm.engine.executor.runner.grammar_masks
    for repeat in range(args.repeats):
        wall.clear(), cpu.clear(), calls.clear()
        fill_s, fills = masks.fill_seconds, masks.num_fills
        tokens, seconds = run(requests)
        steps = max(1, calls["EngineCore.step_with_details"])
        fill = 1e3 * (masks.fill_seconds - fill_s) / max(1, masks.num_fills - fills)
        print(f"{args.kind} run {repeat}: {tokens / seconds:,.0f} tok/s, {steps} steps, "
              f"{seconds / steps * 1e3:.2f} ms/step, worker advance + fill {fill:.2f} ms/step")
        for label in sorted(wall, key=lambda name: -wall[name]):
            print(f"   {label:34s} wall {wall[label] / steps * 1e3:6.3f}  cpu {cpu[label] / steps * 1e3:6.3f} "
                  f"ms/step  ({calls[label] / steps:.2f}/step)")


def _time_calls(cls, name: str, wall, cpu, calls) -> None:
    fn, label = getattr(cls, name), f"{cls.__name__}.{name}"

    def timed(*args, **kwargs):
        t, c = time.perf_counter(), time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            wall[label] += time.perf_counter() - t
            cpu[label] += time.thread_time() - c
            calls[label] += 1
    setattr(cls, name, timed)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
