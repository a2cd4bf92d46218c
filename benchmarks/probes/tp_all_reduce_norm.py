"""Probe: the TP decode step's all-reduce + add + RMSNorm on two GPUs: NCCL, one-shot, Lamport kernel.

The tensor-parallel decode step's all-reduce + residual add + RMSNorm, on two GPUs, per way:

    python -m benchmarks.probes.tp_all_reduce_norm --rows 1,2,4,8 --out tp_ar_norm.json

- ``nccl + norm``: NCCL all-reduce, then the fused add + RMSNorm Triton kernel (two kernels);
- ``one-shot + norm``: torch's symmetric-memory one-shot all-reduce, then the same norm kernel;
- (the barrier kernel that preceded the Lamport one, removed after this benchmark measured it on
  two H200s: 5.83 us a call for one row, 15.75 for eight; docs/performance.md);
- ``lamport wN``: distributed/lamport_all_reduce_norm.py (one kernel, no barrier) at N warps; the
  engine's default is 8.

Each way runs as a chain of ``--calls`` calls (the output and the new residual feed the next call,
as the decoder layers chain them), captured in one CUDA graph per rank and replayed on both ranks
together; reports microseconds per call on rank 0 (median of the replays). The hidden size is 7b's,
3584. Needs two CUDA devices.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import tempfile
from typing import Any, Callable

from benchmarks.common import dump, environment, format_table


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ways(tp, device, torch) -> dict[str, Callable]:
    import torch.distributed as dist

    from aioinfer.distributed.lamport_all_reduce_norm import LamportAllReduceNorm
    from aioinfer.layers.triton_ops.rms_norm import fused_add_rms_norm

    rank, world = dist.get_rank(tp.device_group), dist.get_world_size(tp.device_group)
    dtypes = (torch.bfloat16,)
    part = 8 * 8192 * 4
    lamport = {w: LamportAllReduceNorm.create(tp.device_group.group_name, device, rank, world, part, dtypes)
               for w in (4, 8, 16)}
    for w, op in lamport.items():
        op.num_warps = w
    dist.barrier(group=tp.device_group)

    def nccl(x, residual, weight):
        dist.all_reduce(x, group=tp.device_group)
        return fused_add_rms_norm(x, residual, weight, 1e-6)

    def one_shot(x, residual, weight):
        return fused_add_rms_norm(tp.fast_all_reduce.all_reduce(x), residual, weight, 1e-6)

    ways = {"nccl + norm": nccl, "one-shot + norm": one_shot}
    for w, op in lamport.items():
        ways[f"lamport w{w}"] = (lambda o: lambda x, r, wt: o(x, r, wt, 1e-6))(op)
    return ways


def _rank_main(rank: int, port: int, rows_list: list[int], calls: int, replays: int, out_path: str) -> None:
    import json

    import torch

    from aioinfer.distributed.group import destroy_tp_group, init_tp_group

    os.environ["AIOINFER_TP_SYMM_MEM"] = "1"
    device = torch.device(f"cuda:{rank}")
    tp = init_tp_group(rank, 2, f"tcp://127.0.0.1:{port}", device)
    results: list[dict[str, Any]] = []
    try:
        ways = _ways(tp, device, torch)
        for rows in rows_list:
            x0 = torch.randn((rows, 3584), device=device, dtype=torch.bfloat16) * 0.1
            r0 = torch.randn((rows, 3584), device=device, dtype=torch.bfloat16)
            weight = torch.ones(3584, device=device, dtype=torch.bfloat16)
            for name, fn in ways.items():
                for _ in range(3):  # compile, warm up (outside the capture)
                    fn(x0.clone(), r0, weight)
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    out, s = x0.clone(), r0
                    for _ in range(calls):
                        out, s = fn(out, s, weight)
                times = []
                for _ in range(replays):
                    torch.distributed.barrier(group=tp.control_group)
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    graph.replay()
                    end.record()
                    end.synchronize()
                    times.append(start.elapsed_time(end) * 1000 / calls)
                del graph
                results.append({"way": name, "rows": rows, "us_per_call": statistics.median(times),
                                "us_min": min(times)})
                if rank == 0:
                    print(f"rows {rows}: {name}: {statistics.median(times):.2f} us/call", flush=True)
    finally:
        destroy_tp_group()
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(results, f)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default="1,2,4,8")
    p.add_argument("--calls", type=int, default=200, help="calls per captured chain")
    p.add_argument("--replays", type=int, default=9)
    p.add_argument("--out", default=None)
    args = p.parse_args()

    import json

    import torch

    if torch.cuda.device_count() < 2:
        raise SystemExit("needs two CUDA devices")
    rows_list = [int(r) for r in args.rows.split(",") if r]
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    torch.multiprocessing.spawn(_rank_main, args=(_free_port(), rows_list, args.calls, args.replays, path), nprocs=2)
    with open(path) as f:
        results = json.load(f)
    os.unlink(path)
    env = environment()
    dump(args.out, {"benchmark": "tp_all_reduce_norm (7b hidden 3584, bf16, two GPUs)", "environment": env,
                    "results": results, "argv": vars(args)})
    print(format_table(["way", "rows", "us / call (median)", "us / call (min)"],
                       [[r["way"], r["rows"], r["us_per_call"], r["us_min"]] for r in results]))


if __name__ == "__main__":
    main()
