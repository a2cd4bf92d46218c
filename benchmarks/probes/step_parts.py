"""Probe: a 7b step's time by part (attention, GEMMs, norms, rotary, KV write, activation, sampling, the rest,
the device's idle gaps), aioinfer and vLLM side by side, each part beside its floor.

    python -m benchmarks.probes.step_parts --model qwen2.5-7b --vllm-pythonpath /tmp/vllm-site --out parts.json

Both engines run the same two batches of workload 1's requests (its first ``--num-requests``, their
prompt lengths, random ids) under ``torch.profiler``, each in its own process (vLLM with
``VLLM_ENABLE_V1_MULTIPROCESSING=0``, so that its model runs in the profiled process):

- ``prefill``: every request with ``max_tokens=1``: the prompts' prefill (chunked by the token
  budget, as in workload 1's mixed steps) and one sampled token each; reported per 1,000 prompt tokens;
- ``decode``: the same with ``max_tokens=1 + B + D`` against ``max_tokens=1 + B`` (``--base-tokens``
  B); the difference is D decode steps at ``--num-requests`` rows (workload 1's decode shape),
  reported per step. With B = 0 the baseline is the ``prefill`` batch, and the difference also holds
  what the first decode rows cost inside the mixed steps that still prefill other prompts (about
  20 steps at 256 requests and 8,192 tokens a step); with B past those steps it is pure decode.

Each batch runs once unprofiled (its wall time) and once profiled (device kernels: name, count, time;
the union of their intervals is the device's busy time, the wall time less it the idle gaps). Kernels
are put into parts by name (``PARTS``; both engines' names: aioinfer's Triton kernels, vLLM's FA3,
custom ops and Inductor's fused kernels, cuBLAS/CUTLASS GEMMs); the JSON keeps every kernel, so that
parts can be drawn again. Floors: GEMMs, weight bytes over the copy rate (decode) or matrix FLOPs over
the matrix rate (prefill); attention, KV bytes read over the copy rate, or its FLOPs (prefill).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tempfile
import time
from collections import defaultdict
from typing import Any

from benchmarks.common import (SHAPES, ceilings, default_device, dump, environment, format_table, fresh_cache_salt,
                               make_llm, run_child, workload1, write_child_result, write_dummy_model)

# part -> kernel-name pattern (searched, case-insensitive), first match wins
PARTS = [
    ("kv write", r"kv_write|reshape_and_cache|cache_kernel"),  # before attention: vLLM's is "..._cache_flash"
    ("attention", r"flash|fmha|attn|_decode_kernel|_prefill_kernel|_merge_kernel|_attend_tile|paged_attention"),
    ("gemm", r"gemm|nvjet|cutlass|xmma|_small_batch_linear|splitk|cublas|matmul|mm_kernel"),
    ("rms norm (+ residual)", r"rms|norm|rsqrt|mean_mul_pow"),
    ("rotary", r"rotary|rotate|rope|cos_sin|index_select.*cat|cat.*index_select"),
    ("silu and mul", r"silu|act_and_mul|sigmoid"),
    ("sampling", r"argmax|argmin|topk|top_k|sort|softmax|exponential|sampl|bitmask|gumbel|log_softmax"),
    ("copies", r"memcpy|memset|copy|elementwise_kernel|fill|index|gather|scatter|cat"),
]
_PART_RE = [(name, re.compile(pattern, re.I)) for name, pattern in PARTS]


def part_of(kernel: str) -> str:
    for name, pattern in _PART_RE:
        if pattern.search(kernel):
            return name
    return "other"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=sorted(SHAPES), default="qwen2.5-7b")
    p.add_argument("--num-requests", type=int, default=256)
    p.add_argument("--decode-tokens", type=int, default=32, help="D: decode steps profiled")
    p.add_argument("--base-tokens", type=int, default=0, help="B: decode steps before them (0: from the prefill)")
    p.add_argument("--systems", default="aioinfer,vllm")
    p.add_argument("--vllm-pythonpath", default=os.environ.get("VLLM_PYTHONPATH"))
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--device", default=None, help="cuda (default when present) or cpu (smoke: CPU ops as kernels)")
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--out", default=None)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--folder", default=None, help=argparse.SUPPRESS)
    p.add_argument("--child-out", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    device = default_device(args.device)
    shape = SHAPES[args.model]
    requests = workload1(max_token_id=min(10000, shape.vocab - 1))[: args.num_requests]
    if args.child:
        write_child_result(args.child_out, run_system(args.child, args, device, requests))
        return

    env = environment()
    ceil = ceilings(device == "cuda")
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_dummy_model(shape, tmp)
        for system in [s for s in args.systems.split(",") if s]:
            child_env = dict(os.environ)
            if system == "vllm":
                child_env.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_USE_FLASHINFER_SAMPLER="0")
                if args.vllm_pythonpath:
                    child_env["PYTHONPATH"] = args.vllm_pythonpath
            argv = ["benchmarks.probes.step_parts", "--model", args.model, "--num-requests", str(args.num_requests),
                    "--decode-tokens", str(args.decode_tokens), "--base-tokens", str(args.base_tokens),
                    "--max-num-batched-tokens",
                    str(args.max_num_batched_tokens), "--gpu-memory-utilization", str(args.gpu_memory_utilization),
                    "--device", device, "--folder", str(folder), "--child", system]
            results[system] = run_child(argv, args.timeout, env=child_env)
            print(f"{system}: {json.dumps({k: v for k, v in results[system].items() if k != 'runs'})[:400]}",
                  flush=True)

    prompt_tokens = sum(len(r.prompt) for r in requests)
    floors = part_floors(shape, requests, args.base_tokens + args.decode_tokens / 2, ceil)
    table = parts_table(results, prompt_tokens, args.decode_tokens)
    dump(args.out, {"probe": "step_parts", "model": args.model, "environment": env, "ceilings": ceil,
                    "num_requests": len(requests), "prompt_tokens": prompt_tokens, "decode_tokens": args.decode_tokens,
                    "parts": PARTS, "floors_ms": floors, "table": table, "results": results, "argv": vars(args)})
    systems = [s for s in results if "runs" in results[s]]
    for system in systems:
        for run_name, run in results[system]["runs"].items():
            hist = run["idle_gaps_us"]
            buckets = [name for name in hist if name != "longest_us"]
            print(f"{system} {run_name} (max_tokens {run['max_tokens']}): idle gaps " + ", ".join(
                f"{name} {hist[name]['count']} ({hist[name]['us'] / 1e3:.1f} ms)" for name in buckets))
    for view, unit in (("decode", "ms per decode step"), ("prefill", "ms per 1,000 prompt tokens")):
        print(f"\n{args.model}, {view}: {unit} ({len(requests)} requests; {env.get('device')}, {env['date']})")
        headers = ["part", *systems, *(["aioinfer / vllm"] if {"aioinfer", "vllm"} <= set(systems) else []), "floor"]
        rows = []
        for part in [*(name for name, _ in PARTS), "other", "kernels (sum)", "device busy", "idle gaps", "wall"]:
            values = [table[s][view].get(part) for s in systems]
            ratio = ([values[systems.index("aioinfer")] / values[systems.index("vllm")]
                      if values[systems.index("vllm")] else None] if len(headers) > len(systems) + 2 else [])
            rows.append([part, *values, *ratio, floors[view].get(part)])
        print(format_table(headers, rows))


def parts_table(results: dict[str, Any], prompt_tokens: int, decode_tokens: int) -> dict[str, Any]:
    """Per system: ms per part, per decode step (decode - prefill, over D) and per 1,000 prompt tokens."""
    table: dict[str, Any] = {}
    for system, result in results.items():
        if "runs" not in result:
            continue
        by_run = {}
        for run_name, run in result["runs"].items():
            parts: dict[str, float] = defaultdict(float)
            for kernel in run["kernels"]:
                parts[part_of(kernel["name"])] += kernel["us"] / 1e3
            parts["kernels (sum)"] = sum(k["us"] for k in run["kernels"]) / 1e3
            parts["device busy"] = run["busy_us"] / 1e3
            parts["wall"] = run["wall_s"] * 1e3
            parts["idle gaps"] = max(0.0, parts["wall"] - parts["device busy"])
            by_run[run_name] = parts
        pre, base, dec = by_run["prefill"], by_run.get("base", by_run["prefill"]), by_run["decode"]
        table[system] = {
            "prefill": {k: v * 1000 / prompt_tokens for k, v in pre.items()},
            "decode": {k: (dec.get(k, 0.0) - base.get(k, 0.0)) / decode_tokens for k in set(base) | set(dec)},
        }
    return table


def part_floors(shape, requests, generated: float, ceil: dict[str, float]) -> dict[str, dict[str, float]]:
    """ms floors of the GEMMs and attention: per decode step at these rows (each context its prompt and
    ``generated`` tokens), per 1,000 prompt tokens."""
    bw, rate = ceil["copy_bytes_per_s"], ceil["matmul_flop_per_s"]
    rows = len(requests)
    mean_ctx = sum(len(r.prompt) for r in requests) / rows + generated
    layer_flops = 2 * shape.layers * shape.layer_params  # a token's matmuls through the layers
    head_flops = 2 * shape.embedding_params  # the lm_head's, for each sampled row
    kv_read = rows * mean_ctx * shape.kv_bytes_per_token
    attn_flops_decode = 4 * rows * mean_ctx * shape.heads * shape.head_dim * shape.layers
    decode = {"gemm": 1e3 * max(shape.decode_weight_bytes / bw, (layer_flops + head_flops) * rows / rate),
              "attention": 1e3 * max(kv_read / bw, attn_flops_decode / rate)}
    # prefill: causal attention over each prompt, 1,000 tokens' share
    tokens = sum(len(r.prompt) for r in requests)
    attn_flops_prefill = sum(2 * len(r.prompt) ** 2 * shape.heads * shape.head_dim * shape.layers for r in requests)
    prefill = {"gemm": 1e3 * layer_flops * 1000 / rate,
               "attention": 1e3 * attn_flops_prefill / rate * 1000 / tokens}
    return {"decode": decode, "prefill": prefill}


# ----------------------------------------------------------------------------- children

def run_system(system: str, args, device: str, requests) -> dict[str, Any]:
    if system == "aioinfer":
        from aioinfer import SamplingParams

        llm, _ = make_llm(args.folder, device, None, None, max_model_len=2048, max_num_seqs=len(requests),
                          max_num_batched_tokens=args.max_num_batched_tokens,
                          gpu_memory_utilization=args.gpu_memory_utilization)

        def generate(max_tokens: int) -> None:
            llm.generate([r.prompt for r in requests],
                         SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0),
                         use_tqdm=False, cache_salt=fresh_cache_salt())
        version = "aioinfer"
    elif system == "vllm":
        import vllm
        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt

        llm = LLM(model=args.folder, load_format="dummy", dtype="bfloat16", skip_tokenizer_init=True,
                  max_model_len=2048, max_num_seqs=len(requests), max_num_batched_tokens=args.max_num_batched_tokens,
                  gpu_memory_utilization=args.gpu_memory_utilization, seed=0)
        prompts = [TokensPrompt(prompt_token_ids=list(r.prompt)) for r in requests]

        def generate(max_tokens: int) -> None:
            llm.reset_prefix_cache()
            llm.generate(prompts, SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0,
                                                 detokenize=False), use_tqdm=False)
        version = f"vllm {vllm.__version__}"
    else:
        raise SystemExit(f"unknown system {system}")
    generate(4)  # warm-up: kernels, graphs, allocator
    runs = {"prefill": profile(generate, 1, device)}
    if args.base_tokens:
        runs["base"] = profile(generate, 1 + args.base_tokens, device)
    runs["decode"] = profile(generate, 1 + args.base_tokens + args.decode_tokens, device)
    return {"system": version, "runs": runs}


def profile(generate, max_tokens: int, device: str) -> dict[str, Any]:
    """Wall time unprofiled, then the kernels of a profiled run of the same batch."""
    import torch
    from torch.profiler import ProfilerActivity

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    sync()
    start = time.perf_counter()
    generate(max_tokens)
    sync()
    wall_s = time.perf_counter() - start
    activity = ProfilerActivity.CUDA if device == "cuda" else ProfilerActivity.CPU
    with torch.profiler.profile(activities=[activity]) as prof:
        generate(max_tokens)
        sync()
    totals: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    intervals = []
    for event in prof.events():
        on_device = str(getattr(event, "device_type", "")).endswith("CUDA")
        if (device == "cuda") != on_device or (device != "cuda" and event.cpu_parent is not None):
            continue  # CUDA: device kernels; CPU smoke: top-level ops
        begin, end = event.time_range.start, event.time_range.end
        totals[event.name][0] += 1
        totals[event.name][1] += end - begin
        intervals.append((begin, end))
    kernels = sorted(({"name": name, "count": c, "us": us} for name, (c, us) in totals.items()),
                     key=lambda k: -k["us"])
    busy_us, gaps = _union_us(intervals)
    return {"max_tokens": max_tokens, "wall_s": wall_s, "busy_us": busy_us, "kernels": kernels,
            "idle_gaps_us": _gap_histogram(gaps)}


def _union_us(intervals: list[tuple[float, float]]) -> tuple[float, list[float]]:
    """The time some kernel runs, and the idle gaps between the device's busy stretches (µs)."""
    total, end, gaps = 0.0, float("-inf"), []
    for begin, stop in sorted(intervals):
        if stop <= end:
            continue
        if end != float("-inf") and begin > end:
            gaps.append(begin - end)
        total += stop - max(begin, end)
        end = stop
    return total, gaps


def _gap_histogram(gaps: list[float]) -> dict[str, Any]:
    """Idle gaps inside the profiled run by size: where the device waits (between steps, for the host,
    or between kernels), count and total µs per bucket, and the ten longest."""
    buckets = {"<5us": (0, 5), "5-20us": (5, 20), "20-100us": (20, 100), "100us-1ms": (100, 1e3), ">=1ms": (1e3, 1e12)}
    out: dict[str, Any] = {name: {"count": 0, "us": 0.0} for name in buckets}
    for gap in gaps:
        for name, (low, high) in buckets.items():
            if low <= gap < high:
                out[name]["count"] += 1
                out[name]["us"] += gap
    out["longest_us"] = sorted(gaps, reverse=True)[:10]
    return out


if __name__ == "__main__":
    main()
