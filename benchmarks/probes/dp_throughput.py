"""Probe: workload 1 through the async ``DataParallelEngine`` at several data-parallel sizes in one run.

    python -m benchmarks.probes.dp_throughput --model qwen2.5-7b --sizes 1,2 --out dp_7b.json
    python -m benchmarks.probes.dp_throughput --model tiny --device cpu --num-requests 16 \\
        --max-input-len 150 --max-output-len 120          # CPU smoke test of the script, not a number

Each size runs in its own child process (own CUDA contexts, memory freed between sizes); size N
uses GPUs 0..N-1, one replica each. All requests are submitted at once through ``generate``, as
concurrent consumers on one event loop (uvloop when installed), so the figure includes the async
engine's delivery path and the router; the offline ``LLM`` has neither. Reports output tok/s, the
scaling against the first size, how the router split the requests and tokens, and achieved /
floor against an ideal-split floor: max(compute / N, max(output length) steps x weight reads + KV
reads / N), i.e. one GPU's floor with the work divided evenly and the weights read by every GPU.
Imports neither quart, hypercorn nor orjson (the GPU machine lacks them).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import (default_device, workload1_for, SHAPES, ceilings, dump, environment, format_table, fresh_cache_salt, output_tokens,
                               run_child, workload1, workload_floor, write_child_result, write_dummy_model)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=sorted(SHAPES), default="qwen2.5-7b")
    p.add_argument("--sizes", default="1,2", help="data-parallel sizes to run, comma separated")
    p.add_argument("--num-requests", type=int, default=256, help="the workload: 256")
    p.add_argument("--max-input-len", type=int, default=1024, help="workload 1: 1024 (>= 100)")
    p.add_argument("--max-output-len", type=int, default=1024, help="workload 1: 1024 (>= 100)")
    p.add_argument("--device", default=None, help="cuda (default when present) or cpu (smoke test)")
    p.add_argument("--attention-backend", default=None)
    p.add_argument("--enforce-eager", choices=("true", "false"), default=None)
    p.add_argument("--async-scheduling", choices=("true", "false"), default=None)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--no-uvloop", action="store_true", help="plain asyncio even where uvloop is installed")
    p.add_argument("--no-stream", action="store_true",
                   help="generate(stream=False): one merged delta per request (as non-streaming HTTP requests)")
    p.add_argument("--every", type=int, default=1,
                   help="run every K-th request only (K = N: one replica's share of the work at size N, alone)")
    p.add_argument("--switch-interval", type=float, default=None,
                   help="sys.setswitchinterval in seconds for the child (Python's default: 0.005)")
    p.add_argument("--timeout", type=float, default=600, help="seconds per size's child process")
    p.add_argument("--out", default=None, help="JSON results")
    p.add_argument("--child-dp", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--child-out", default=None, help=argparse.SUPPRESS)
    p.add_argument("--folder", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()

    import torch

    device = default_device(args.device)
    shape = SHAPES[args.model]
    requests = workload1_for(shape, args.num_requests, args.max_input_len, args.max_output_len)[::args.every]
    if args.child_dp is not None:
        write_child_result(args.child_out, run_size(args, device, requests))
        return

    sizes = [int(x) for x in args.sizes.split(",") if x]
    env = environment()
    if device == "cuda":
        env["cuda_device_count"] = torch.cuda.device_count()
    ceil = ceilings(device == "cuda")
    print(f"{env}\nceilings: copy {ceil['copy_bytes_per_s'] / 1e12:.2f} TB/s, "
          f"bf16 matmul {ceil['matmul_flop_per_s'] / 1e12:.0f} TFLOP/s ({ceil['ceilings_source']})", flush=True)
    results: dict[int, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_dummy_model(shape, tmp)
        for size in sizes:
            cmd = ["benchmarks.probes.dp_throughput", "--model", args.model, "--folder", str(folder), "--device", device,
                   "--num-requests", str(args.num_requests), "--max-input-len", str(args.max_input_len),
                   "--max-output-len", str(args.max_output_len), "--max-num-seqs", str(args.max_num_seqs),
                   "--max-num-batched-tokens", str(args.max_num_batched_tokens),
                   "--gpu-memory-utilization", str(args.gpu_memory_utilization), "--child-dp", str(size),
                   "--every", str(args.every)]
            if args.switch_interval is not None:
                cmd += ["--switch-interval", str(args.switch_interval)]
            for flag in ("attention_backend", "enforce_eager", "async_scheduling"):
                if getattr(args, flag) is not None:
                    cmd += ["--" + flag.replace("_", "-"), getattr(args, flag)]
            if args.no_uvloop:
                cmd.append("--no-uvloop")
            if args.no_stream:
                cmd.append("--no-stream")
            results[size] = run_child(cmd, args.timeout)
            print(f"dp={size}: {results[size]}", flush=True)

    base = results[sizes[0]].get("tok_per_s")
    rows, floors = [], {}
    for size in sizes:
        r = results[size]
        floors[size] = ideal_split_floor(shape, requests, size, ceil)
        if "tok_per_s" not in r:
            rows.append([size, len(requests), None, None, None, None, None, None, None, r.get("error")])
            continue
        rows.append([size, len(requests), r["output_tokens"], r["seconds"], r["tok_per_s"],
                     f"{r['tok_per_s'] / base:.2f}x" if base else None,
                     r["tok_per_s"] / floors[size]["floor_tok_per_s"],
                     "/".join(str(x["requests"]) for x in r["replicas"]),
                     "/".join(str(x["output_tokens"]) for x in r["replicas"]), r["loop"]])
    payload = {"benchmark": "dp_throughput (workload 1, async DataParallelEngine)", "model": args.model,
               "shape": shape.hf_config(), "environment": env, "ceilings": ceil, "device": device,
               "num_requests": len(requests), "prompt_tokens": sum(len(r.prompt) for r in requests),
               "output_tokens": output_tokens(requests), "floors": floors,
               "results": {str(k): v for k, v in results.items()},
               "scaling_vs_first_size": {str(k): (results[k]["tok_per_s"] / base if base and "tok_per_s" in results[k]
                                                  else None) for k in sizes}, "argv": vars(args)}
    dump(args.out, payload)
    print()
    print(f"workload 1 through DataParallelEngine, {args.model} (dummy weights), {env.get('device')}, {env['date']}; "
          f"{len(requests)} requests, {output_tokens(requests):,} output tokens; size N on GPUs 0..N-1")
    print(format_table(["dp size", "requests", "output tokens", "seconds", "tok/s", f"vs dp={sizes[0]}",
                        "of ideal-split floor", "requests per replica", "output tokens per replica",
                        "event loop / note"], rows))


def ideal_split_floor(shape, requests, size: int, ceil: dict[str, float]) -> dict[str, float]:
    one = workload_floor(shape, requests, ceil["copy_bytes_per_s"], ceil["matmul_flop_per_s"])
    weights_s = max(r.max_tokens for r in requests) * shape.decode_weight_bytes / ceil["copy_bytes_per_s"]
    kv_s = one["floor_memory_s"] - weights_s
    floor_s = max(one["floor_compute_s"] / size, weights_s + kv_s / size)
    return {"floor_s": floor_s, "floor_tok_per_s": one["output_tokens"] / floor_s}


# ----------------------------------------------------------------------------- child

def _thread_cpu_seconds() -> dict[str, float]:
    """CPU seconds (user + system) each live thread of this process used so far, by thread name
    (Linux /proc; empty elsewhere). Where the sum over threads nears the wall time, one GIL is the cap."""
    import threading

    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for thread in threading.enumerate():
        try:
            fields = Path(f"/proc/self/task/{thread.native_id}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        name = thread.name if thread.name not in out else f"{thread.name}-{thread.native_id}"
        out[name] = (int(fields[11]) + int(fields[12])) / tick  # utime, stime (fields 14, 15 of stat)
    return out


def run_size(args, device: str, requests) -> dict[str, Any]:
    import anyio

    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)

    use_uvloop = False
    if not args.no_uvloop:
        try:
            import uvloop  # noqa: F401

            use_uvloop = True
        except ImportError:
            pass
    result = anyio.run(_run_size, args, device, requests, backend="asyncio",
                       backend_options={"use_uvloop": use_uvloop})
    result["loop"] = ("uvloop" if use_uvloop else "asyncio") + (", stream=False" if args.no_stream else ", streaming")
    return result


class _PerReplica:
    """Observer: output tokens and requests finished per replica; its steps split into decode-only
    steps and steps that carry prompt tokens, with the seconds the GPU thread spent in each kind."""

    def __init__(self, size: int) -> None:
        self.requests = [0] * size
        self.tokens = [0] * size
        self.steps = [{"decode_steps": 0, "decode_s": 0.0, "prompt_steps": 0, "prompt_s": 0.0, "prompt_tokens": 0}
                      for _ in range(size)]
        self.counting = False

    def on_step(self, stats) -> None:
        if not self.counting or not stats.num_batched_requests:
            return
        row = self.steps[stats.engine_index]
        prompt_tokens = stats.num_scheduled_tokens - stats.num_generation_tokens
        kind = "prompt" if prompt_tokens > 0 else "decode"
        row[kind + "_steps"] += 1
        row[kind + "_s"] += stats.step_time
        row["prompt_tokens"] += max(prompt_tokens, 0)

    def on_request_done(self, stats) -> None:
        if stats.request_id.startswith("w1-"):
            self.requests[stats.engine_index] += 1
            self.tokens[stats.engine_index] += stats.num_output_tokens

    def on_rejected(self, reason) -> None:
        pass


async def _run_size(args, device: str, requests) -> dict[str, Any]:
    import anyio

    from aioinfer import DataParallelEngine, SamplingParams

    size = args.child_dp
    options: dict[str, Any] = dict(
        load_format="dummy", dtype="bfloat16" if device == "cuda" else "float32", device=device,
        max_model_len=2048, max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
        gpu_memory_utilization=args.gpu_memory_utilization, max_waiting_requests=len(requests) + 64,
        max_waiting_prompt_tokens=sum(len(r.prompt) for r in requests) + 1_000_000)
    if args.attention_backend:
        options["attention_backend"] = args.attention_backend
    for flag in ("enforce_eager", "async_scheduling"):
        if getattr(args, flag) is not None:
            options[flag] = getattr(args, flag) == "true"
    per_replica = _PerReplica(size)

    async def run(engine, reqs, tag: str) -> int:
        got = [0]
        salt = fresh_cache_salt()  # repeated prompts (warm-up, the DP=1 run) are computed again

        async def one(i, r) -> None:
            params = SamplingParams(max_tokens=r.max_tokens, ignore_eos=True, temperature=0.0)
            async for delta in engine.generate(r.prompt, params, request_id=f"{tag}{i}", cache_salt=salt,
                                               stream=not args.no_stream):
                got[0] += len(delta.token_ids)

        async with anyio.create_task_group() as tg:
            for i, r in enumerate(reqs):
                tg.start_soon(one, i, r)
        return got[0]

    t0 = time.perf_counter()
    async with DataParallelEngine(args.folder, data_parallel_size=size, observers=[per_replica],
                                  **options) as engine:
        init_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        warm = workload1(num_requests=4 * size, seed=1, max_input_len=200, max_output_len=110, max_token_id=500)
        await run(engine, warm, "warm-")  # first kernels of each replica, prefill shapes, allocator
        warmup_s = time.perf_counter() - t0
        per_replica.counting = True
        cpu_before = _thread_cpu_seconds()
        start = time.perf_counter()
        got = await run(engine, requests, "w1-")
        seconds = time.perf_counter() - start
        cpu_after = _thread_cpu_seconds()
        stats = engine.stats()
    assert got == output_tokens(requests), (got, output_tokens(requests))
    return {"dp": size, "output_tokens": got, "seconds": seconds, "tok_per_s": got / seconds, "init_s": init_s,
            "warmup_s": warmup_s, "devices": [r["device"] for r in stats["replicas"]],
            "replicas": [{"requests": n, "output_tokens": t, **steps}
                         for n, t, steps in zip(per_replica.requests, per_replica.tokens, per_replica.steps)],
            "thread_cpu_s": {name: round(cpu_after[name] - cpu_before.get(name, 0.0), 3) for name in cpu_after},
            "switch_interval": sys.getswitchinterval(),
            "routed_by_affinity": sum(r["routed_by_affinity"] for r in stats["replicas"])}


if __name__ == "__main__":
    main()
