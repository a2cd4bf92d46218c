"""All-reduce latency of the tensor-parallel device group, the cost TP adds to every decode step.

    python -m benchmarks.allreduce_latency --tp 2 --hidden 3584 --layers 28

A batch-1 decode step of an L-layer model does 2L + 1 all-reduces of [batch, hidden] (o_proj and
down_proj per layer, plus the embedding). This times them the way the engine issues them: eager,
and replayed from one captured CUDA graph of 2L + 1 all-reduces (CUDA only). It also says whether
the GPUs can reach each other's memory directly (peer access), which decides NCCL's transport.
"""

from __future__ import annotations

import argparse
import socket
import time


def _rank(rank: int, args: argparse.Namespace, port: int) -> None:
    import torch

    from aioinfer.distributed.group import destroy_tp_group, init_tp_group

    cuda = torch.cuda.is_available() and args.device != "cpu"
    device = torch.device(f"cuda:{rank}") if cuda else torch.device("cpu")
    group = init_tp_group(rank, args.tp, f"tcp://127.0.0.1:{port}", device)
    dtype = torch.bfloat16 if cuda else torch.float32
    x = torch.ones(args.batch, args.hidden, dtype=dtype, device=device)
    per_step = 2 * args.layers + 1

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    for _ in range(20):
        group.all_reduce(x)
    sync()
    start = time.perf_counter()
    for _ in range(args.iters):
        group.all_reduce(x)
    sync()
    eager_us = (time.perf_counter() - start) / args.iters * 1e6
    line = f"rank {rank}: eager all-reduce [{args.batch}, {args.hidden}] {eager_us:.1f} us"
    if cuda:
        line += f"; peer access 0<->1: {torch.cuda.can_device_access_peer(0, 1)}"
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(per_step):
                group.all_reduce(x)
        graph.replay()
        sync()
        start = time.perf_counter()
        for _ in range(args.iters // per_step + 1):
            graph.replay()
        sync()
        step_us = (time.perf_counter() - start) / (args.iters // per_step + 1) * 1e6
        line += (f"; graph of {per_step}: {step_us:.0f} us per step ({step_us / per_step:.1f} us each)")
    print(line, flush=True)
    destroy_tp_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--hidden", type=int, default=3584)  # qwen2.5-7b
    p.add_argument("--layers", type=int, default=28)
    p.add_argument("--iters", type=int, default=2000)
    p.add_argument("--device", default=None, help="cpu: gloo over host memory (smoke test)")
    args = p.parse_args()

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_rank, args=(args, port), nprocs=args.tp)


if __name__ == "__main__":
    main()
