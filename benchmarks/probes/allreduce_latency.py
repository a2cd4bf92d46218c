"""Probe: all-reduce latency of the tensor-parallel device group, the cost TP adds to every decode step.

    python -m benchmarks.probes.allreduce_latency --tp 2 --hidden 3584 --layers 28
    python -m benchmarks.probes.allreduce_latency --tp 2 --hidden 3584 --layers 28 --symm-mem
    python -m benchmarks.probes.allreduce_latency --tp 2 --control      # the per-step control message (CPU is enough)

A batch-1 decode step of an L-layer model does 2L + 1 all-reduces of [batch, hidden] (o_proj and
down_proj per layer, plus the embedding). This times them the way the engine issues them: eager,
and replayed from one captured CUDA graph of 2L + 1 all-reduces (CUDA only). It also says whether
the GPUs can reach each other's memory directly (peer access), which decides NCCL's transport.
``--symm-mem`` sets AIOINFER_TP_SYMM_MEM=1, so sizes up to its limit take the one-shot
symmetric-memory kernel (aioinfer/distributed/symm_all_reduce.py) instead of NCCL; the line says
which path ran, and each rank first checks that path's sum against NCCL's.

``--control`` times instead the message rank 0 sends the workers every step, a decode
SchedulerOutput of 1 and 64 requests: through the gloo control group's ``broadcast_object``
(``broadcast_object_list``: the old per-step path) and through the step channel (one pickle, one
socket write). Per message: rank 0's time in the call, and the latency until the worker holds the
object (both clocks are the machine's monotonic clock). Messages go out one every --gap-ms, as
steps do, so each one finds the worker waiting.
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
    fast = group.fast_all_reduce is not None and group.fast_all_reduce.accepts(x)
    if fast:
        import torch.distributed as dist

        mine = torch.randn(args.batch, args.hidden, generator=torch.Generator().manual_seed(rank)).to(device, dtype)
        want = mine.clone()
        dist.all_reduce(want, group=group.device_group)
        torch.testing.assert_close(group.all_reduce(mine), want)

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
    path = "symm-mem one-shot" if fast else "nccl" if cuda else "gloo"
    line = f"rank {rank}: eager all-reduce ({path}) [{args.batch}, {args.hidden}] {eager_us:.1f} us"
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


def _decode_step(num_requests: int):
    from aioinfer.core.scheduler_output import ScheduledRequest, SchedulerOutput

    # Mid-generation decode rows: one token each, a 33-block table (about 520 tokens of context).
    rows = [ScheduledRequest(f"cmpl-{i:08d}", [1234 + i], 517, list(range(40 * i, 40 * i + 33)), True)
            for i in range(num_requests)]
    return SchedulerOutput(scheduled=rows, new_requests=[], finished_request_ids=[],
                           num_scheduled_tokens=num_requests)


def _median_us(seconds: list[float]) -> float:
    import statistics

    return statistics.median(seconds[20:]) * 1e6  # the first 20 are warm-up


def _control_rank(rank: int, args: argparse.Namespace, port: int) -> None:
    import torch
    import torch.distributed as dist

    from aioinfer.distributed.group import destroy_tp_group, init_tp_group
    from aioinfer.executor.step_channel import StepReceiver, StepSender

    torch.set_num_threads(1)
    init_method = f"tcp://127.0.0.1:{port}"
    group = init_tp_group(rank, args.tp, init_method, torch.device("cpu"))
    channel = StepSender(group, init_method, 60.0) if rank == 0 else StepReceiver(group, init_method)
    paths = {"broadcast_object": (group.broadcast_object, lambda: group.broadcast_object(None)),
             "step channel": (channel.send, None) if rank == 0 else (None, channel.recv)}
    for num_requests in (1, 64):
        step = _decode_step(num_requests)
        for name, (send, receive) in paths.items():
            spent, latency = [], []
            for i in range(args.messages + 20):
                if rank == 0:
                    time.sleep(args.gap_ms / 1e3)
                    start = time.perf_counter()
                    send((start, step))
                    spent.append(time.perf_counter() - start)
                else:
                    sent_at, got = receive()
                    latency.append(time.perf_counter() - sent_at)
                    assert got == step
            medians: list = [None] * args.tp
            dist.all_gather_object(medians, _median_us(spent or latency), group=group.control_group)
            if rank == 0:
                print(f"{num_requests:3d} requests, {name:16s}: rank 0 in the call {medians[0]:6.1f} us, "
                      f"latency to the workers {', '.join(f'{m:.1f}' for m in medians[1:])} us", flush=True)
    if rank == 0:
        channel.close()
    destroy_tp_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--hidden", type=int, default=3584)  # qwen2.5-7b
    p.add_argument("--layers", type=int, default=28)
    p.add_argument("--iters", type=int, default=2000)
    p.add_argument("--device", default=None, help="cpu: gloo over host memory (smoke test)")
    p.add_argument("--symm-mem", action="store_true", help="AIOINFER_TP_SYMM_MEM=1: one-shot all-reduce")
    p.add_argument("--control", action="store_true", help="time the per-step control message instead")
    p.add_argument("--messages", type=int, default=300, help="--control: messages per path and size")
    p.add_argument("--gap-ms", type=float, default=2.0, help="--control: time between messages")
    args = p.parse_args()

    import os

    import torch.multiprocessing as mp

    if args.symm_mem:
        os.environ["AIOINFER_TP_SYMM_MEM"] = "1"  # the spawned ranks inherit it

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_control_rank if args.control else _rank, args=(args, port), nprocs=args.tp)


if __name__ == "__main__":
    main()
