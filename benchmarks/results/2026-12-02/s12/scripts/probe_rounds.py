"""Twelfth session, call 1: what slows the constrained 0.5b step. Forms, alternating in one engine:

  free          unconstrained
  free_block    unconstrained, the step's sync a blocking event (the engine thread's CPU is then its work, not its spin)
  constrained   every request constrained by the free-strings schema (the shipped path)
  fake          the constrained path with llguidance taken out: matchers never consume, masks are a
                constant all-allowed buffer (the engine-side Python, the worker, its GIL handoffs and the copy)
  free_busy     unconstrained, beside a thread that keeps llguidance computing 256 string-state masks
                twice (about consume + masks) then sleeping 1 ms: llguidance's load without the engine-side code
  cons_t2       constrained, llguidance on 2 threads
  fake_inline   fake without the worker thread: the engine thread starts the (constant) masks' copy at sampling
  X_long        form X with the interpreter's switch interval kept while the worker needs the GIL

Per run: tok/s, ms/step, the engine thread's CPU ms/step, the other threads' CPU ms/step, the
machine's steal ms/step (/proc/stat, all CPUs), and the engine thread's CPU in schedule, update,
runner prepare, sample, collect and output processing (thread_time around each).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import statistics
import tempfile
import threading
import time

import torch

from aioinfer import SamplingParams
from aioinfer.core.scheduler import Scheduler
from aioinfer.engine.output_processor import OutputProcessor
from aioinfer.structured_output import StructuredOutputsParams
from aioinfer.worker import grammar_mask, model_runner
from aioinfer.worker.grammar_mask import GrammarMasks
from benchmarks.common import SHAPES, default_device, fresh_cache_salt, make_llm, workload1, write_dummy_model
from benchmarks.offline_throughput import STRUCTURED_SCHEMAS

PHASES = {"schedule": (Scheduler, "schedule"), "update": (Scheduler, "update"),
          "prepare": (model_runner.ModelRunner, "prepare"), "run": (model_runner.ModelRunner, "run"),
          "sample": (model_runner.ModelRunner, "_sample"), "collect": (model_runner.ModelRunner, "collect"),
          "outputs": (OutputProcessor, "process")}
PHASE_CPU = {name: 0.0 for name in PHASES}


def _wrap(cls, name, key):
    inner = getattr(cls, name)

    def timed(*a, **k):
        t = time.thread_time()
        try:
            return inner(*a, **k)
        finally:
            PHASE_CPU[key] += time.thread_time() - t
    setattr(cls, name, timed)


def _steal_ticks() -> int:
    with open("/proc/stat") as f:
        fields = f.readline().split()
    return int(fields[8]) if len(fields) > 8 else 0


def _other_threads_cpu(engine_tid: int) -> float:
    total = 0
    for tid in os.listdir("/proc/self/task"):
        if int(tid) == engine_tid:
            continue
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                parts = f.read().rsplit(")", 1)[1].split()
            total += int(parts[11]) + int(parts[12])
        except OSError:
            pass
    return total / os.sysconf("SC_CLK_TCK")


class _FakeExecutor:
    def consume_token_par(self, live):
        return [True] * len(live)

    def unsafe_compute_mask_ptr(self, *a):
        pass

    def unsafe_compute_mask_ptr_with_draft_token(self, *a):
        pass


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="qwen2.5-0.5b")
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--forms", default="free,free_block,constrained,fake,free_busy,cons_t2")
    p.add_argument("--out", default=None)
    p.add_argument("--smoke", action="store_true", help="CPU check of the script: a tiny shape, 32 short requests")
    args = p.parse_args()
    device = default_device(None)
    shape = SHAPES[args.model]
    if args.smoke:
        from benchmarks.common import ModelShape
        shape = ModelShape("tinyq", 1, 64, 4, 2, 16, 128, 151936, True, max_position=4096)
    folder = write_dummy_model(shape, tempfile.mkdtemp())
    llm, _ = make_llm(str(folder), device, None, None, max_model_len=2048, max_num_seqs=256,
                      max_num_batched_tokens=8192, gpu_memory_utilization=0.9, tokenizer=args.tokenizer)
    engine = llm.engine
    masks: GrammarMasks = engine.runner.grammar_masks
    constraint = StructuredOutputsParams(json=STRUCTURED_SCHEMAS["strings"])
    for key, (cls, name) in PHASES.items():
        _wrap(cls, name, key)
    engine_tid = threading.get_native_id()

    def timed(requests, constrained: bool) -> dict:
        params = [SamplingParams(max_tokens=r.max_tokens, ignore_eos=True, temperature=0.0,
                                 structured_outputs=constraint if constrained else None) for r in requests]
        steps0, phases0 = engine.num_steps, dict(PHASE_CPU)
        fill0, fills0 = masks.fill_seconds, masks.num_fills
        torch.cuda.synchronize() if device == "cuda" else None
        steal0, others0 = _steal_ticks(), _other_threads_cpu(engine_tid)
        cpu, start = time.thread_time(), time.perf_counter()
        outs = llm.generate([r.prompt for r in requests], params, use_tqdm=False, cache_salt=fresh_cache_salt())
        torch.cuda.synchronize() if device == "cuda" else None
        seconds, cpu = time.perf_counter() - start, time.thread_time() - cpu
        others = _other_threads_cpu(engine_tid) - others0
        steal = (_steal_ticks() - steal0) / os.sysconf("SC_CLK_TCK")
        tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        steps = max(1, engine.num_steps - steps0)
        ms = lambda s: round(1e3 * s / steps, 4)  # noqa: E731
        return {"tok_per_s": tokens / seconds, "steps": steps, "ms_per_step": ms(seconds),
                "engine_cpu": ms(cpu), "others_cpu": ms(others), "steal_all_cpus": ms(steal),
                "worker": (round(1e3 * (masks.fill_seconds - fill0) / (masks.num_fills - fills0), 4)
                           if masks.num_fills > fills0 else 0.0),
                **{f"cpu_{k}": ms(PHASE_CPU[k] - phases0[k]) for k in PHASES}}

    real_copy_to_host = model_runner._copy_to_host

    def blocking_copy_to_host(result):
        copied, ready = real_copy_to_host(result)
        if ready is not None:
            ready = torch.cuda.Event(blocking=True)
            ready.record()
        return copied, ready

    fake_buffers: dict = {}
    real_host_buffer = GrammarMasks._host_buffer
    real_start = GrammarMasks.start

    def fake_host_buffer(self, num_rows, drafts):
        buf = fake_buffers.get(num_rows)
        if buf is None:
            buf = fake_buffers[num_rows] = torch.full((num_rows, self.num_words), -1, dtype=torch.int32,
                                                      pin_memory=device == "cuda")
        return buf

    busy_stop = threading.Event()

    def busy_loop():
        import llguidance

        executor = llguidance.LLExecutor()
        matchers = llm.inputs.compile_ahead([constraint] * 256)
        tok = llm.tokenizer
        prefix = tok.encode('{"notes": ["', add_special_tokens=False)
        for m in matchers:
            m.consume_tokens(prefix)
        print(f"busy loop: {sum(m.is_error() for m in matchers)} of 256 matchers in error after {prefix}", flush=True)
        buf = torch.empty((256, masks.num_words), dtype=torch.int32)
        pairs = [(m, k) for k, m in enumerate(matchers)]
        while not busy_stop.is_set():
            executor.unsafe_compute_mask_ptr(pairs, buf.data_ptr(), masks.num_words * 4, 256)
            executor.unsafe_compute_mask_ptr(pairs, buf.data_ptr(), masks.num_words * 4, 256)
            time.sleep(0.001)

    def form_run(form, requests):
        if form == "free":
            return timed(requests, False)
        if form in ("constrained", "cons"):
            return timed(requests, True)
        if form == "free_block":
            model_runner._copy_to_host = blocking_copy_to_host
            try:
                return timed(requests, False)
            finally:
                model_runner._copy_to_host = real_copy_to_host
        if form.endswith("_long"):  # the interpreter's own switch interval while the worker needs the GIL
            saved_interval = grammar_mask._HANDOFF.seconds
            grammar_mask._HANDOFF.seconds = sys.getswitchinterval()
            try:
                return form_run(form[:-len("_long")], requests)
            finally:
                grammar_mask._HANDOFF.seconds = saved_interval
        if form in ("fake", "fake_inline"):
            saved = masks._executor
            masks._executor = _FakeExecutor()
            GrammarMasks._host_buffer = fake_host_buffer
            if form == "fake_inline":  # no worker: the engine thread "computes" the masks at sampling
                GrammarMasks.start = lambda self, pending, live=(): self.advance(live)
            try:
                return timed(requests, True)
            finally:
                masks._executor = saved
                GrammarMasks._host_buffer = real_host_buffer
                GrammarMasks.start = real_start
        if form == "free_busy":
            busy_stop.clear()
            t = threading.Thread(target=busy_loop, daemon=True)
            t.start()
            time.sleep(1.0)  # its matchers built
            try:
                return timed(requests, False)
            finally:
                busy_stop.set()
                t.join()
        if form == "cons_t2":
            import llguidance

            saved = masks._executor
            masks._executor = llguidance.LLExecutor(2)
            try:
                return timed(requests, True)
            finally:
                masks._executor = saved
        raise ValueError(form)

    warm = workload1(num_requests=4, seed=1, max_input_len=200, max_output_len=110, max_token_id=500)
    timed(warm, False), timed(warm, True)
    requests = workload1(max_token_id=min(10000, shape.vocab - 1))[:256]
    if args.smoke:
        requests = [dataclasses.replace(r, max_tokens=min(r.max_tokens, 20)) for r in requests[:32]]
    forms = args.forms.split(",")
    runs = []
    for round_ in range(args.rounds):
        for form in forms:
            r = form_run(form, requests)
            runs.append({"round": round_, "form": form, **r})
            print(f"round {round_} {form:>12}: {r['tok_per_s']:8,.0f} tok/s " +
                  " ".join(f"{k}={v}" for k, v in r.items() if k not in ("tok_per_s", "steps")), flush=True)
    summary = {}
    for form in forms:
        mine = [r for r in runs if r["form"] == form]
        summary[form] = {k: round(statistics.median(r[k] for r in mine), 4) for k in mine[0] if k not in ("round", "form")}
        if form != "free":
            ratios = [r["tok_per_s"] / next(f["tok_per_s"] for f in runs if f["form"] == "free" and f["round"] == r["round"])
                      for r in mine]
            summary[form]["ratio_to_free_median"] = round(statistics.median(ratios), 3)
            summary[form]["ratios"] = [round(x, 3) for x in ratios]
    print(json.dumps(summary, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"summary": summary, "runs": runs}, f, indent=1)
    llm.shutdown()


if __name__ == "__main__":
    main()
