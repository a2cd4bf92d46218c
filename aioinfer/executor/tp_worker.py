"""The worker process of a tensor-parallel rank > 0: join the group, load the shard, replay rank 0's steps.

Started by rank 0 with torch.multiprocessing's 'spawn' (``worker_main``), or, for ranks on other
machines, by hand or by any launcher that sets torch.distributed's environment
(``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``)::

    python -m aioinfer.executor.tp_worker

Rank 0 broadcasts the EngineConfig after the rendezvous, so a worker needs no options. Each step
arrives on the step channel as (steps rank 0 has launched and not collected, SchedulerOutput); the
worker collects its own oldest steps down to that count, then launches the step on its ModelRunner
like rank 0 does (same inputs, same seeded sampling, so the same tokens: a look-ahead step reads
the previous step's sampled ids on this rank's device) and throws the results away. It never
waits for its device otherwise, so it too launches step N+1 while step N runs.
``None`` is the stop sentinel. A failure is reported through ``conn`` (when there is one) and ends
the process, which rank 0 notices at its next collective or liveness check.

The process leaves with ``os._exit`` after either: tearing NCCL down "gracefully" waits on peers
and on CUDA graphs that captured its kernels, and nothing is left here that the OS cannot free.
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
from typing import Any

logger = logging.getLogger(__name__)

STARTED, READY, FAILED = "started", "ready", "failed"  # messages on a spawned worker's pipe


def worker_main(rank: int, world_size: int, init_method: str, device: str, conn: Any | None = None) -> None:
    """Entry point of one worker process; exits when rank 0 broadcasts the stop sentinel."""
    try:
        import torch

        from aioinfer.distributed.group import init_tp_group
        from aioinfer.executor.runner_setup import build_rank_runner, rank_config
        from aioinfer.executor.step_channel import open_step_receiver

        if device == "cpu":
            # The ranks share the machine's cores; without this each would start one thread per core.
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
        _send(conn, STARTED)
        group = init_tp_group(rank, world_size, init_method, torch.device(device))
        config = rank_config(group.broadcast_object(None), device)
        channel = open_step_receiver(group, init_method)
        _, runner = build_rank_runner(config, group, tokenizer_loader=lambda *args: None)
        _send(conn, READY)
        replay(channel, runner)
    except BaseException:  # noqa: BLE001 - rank 0 must hear why, then this process ends
        text = traceback.format_exc()
        logger.error("tensor-parallel rank %d failed:\n%s", rank, text)
        _send(conn, FAILED, text)
        _exit(1)
    _exit(0)


def replay(channel, runner) -> None:
    """Run rank 0's steps until the stop sentinel, launching and collecting in rank 0's order."""
    from collections import deque

    launched: deque = deque()  # this rank's steps not collected yet, oldest first
    while (message := channel.recv()) is not None:
        uncollected_on_rank0, scheduler_output = message
        while len(launched) > uncollected_on_rank0:
            runner.collect(launched.popleft())
        launched.append(runner.launch(scheduler_output))


def _exit(code: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _send(conn: Any | None, kind: str, detail: str = "") -> None:
    if conn is None:
        return
    try:
        conn.send((kind, detail))
    except (OSError, EOFError, BrokenPipeError):
        pass  # rank 0 is gone; nothing to tell


def main() -> None:
    """``python -m aioinfer.executor.tp_worker``: one rank of a multi-machine group (env:// rendezvous)."""
    import torch

    logging.basicConfig(level=logging.INFO)
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu"
    worker_main(rank, world_size, "env://", device)


if __name__ == "__main__":
    main()
