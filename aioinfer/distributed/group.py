"""One engine's tensor-parallel group: its rank and size, and the collectives the layers need.

Two process groups over the same ranks:

- the device group carries activations (NCCL on CUDA, gloo on CPU); its collectives are issued
  on the current stream, so they can sit inside captured CUDA graphs;
- the control group (gloo, host memory) carries each step's SchedulerOutput and small agreements
  (the KV block count, whether every rank captured its CUDA graphs). Workers wait in it while the
  engine is idle, which may last for hours, so it has no practical timeout; a peer that dies
  still breaks it at once, because the peer's sockets close.

Small all-reduces on CUDA may take a one-shot symmetric-memory kernel instead of NCCL, opt-in
(symm_all_reduce.py).

``SINGLE`` is the world-size-1 group: every collective returns its input untouched, so the layers
cost nothing extra without tensor parallelism.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
from dataclasses import dataclass
from typing import Any

import torch

from aioinfer.errors import TensorParallelError

logger = logging.getLogger(__name__)

# Seconds a device-group collective (or the start-up rendezvous) may wait for the other ranks.
DEVICE_TIMEOUT_S = float(os.environ.get("AIOINFER_TP_TIMEOUT_S", "600"))
_CONTROL_TIMEOUT = datetime.timedelta(days=3650)


@dataclass(frozen=True, slots=True)
class TPGroup:
    rank: int  # 0 is the engine process, which schedules
    world_size: int
    device_group: Any | None = None  # torch ProcessGroup; None at world size 1
    control_group: Any | None = None  # gloo ProcessGroup; None at world size 1
    fast_all_reduce: Any | None = None  # SymmMemAllReduce where usable (CUDA, one host; AIOINFER_TP_SYMM_MEM=0: off)

    @property
    def is_parallel(self) -> bool:
        return self.world_size > 1

    def shard(self, total: int, what: str) -> int:
        """This rank's part of ``total`` (heads, rows...) split evenly; TensorParallelError if uneven."""
        if total % self.world_size:
            raise TensorParallelError(
                f"{what} ({total}) is not divisible by tensor_parallel_size ({self.world_size})")
        return total // self.world_size

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum ``x`` over the ranks; returns the sum: ``x`` itself, summed in place, or a new tensor."""
        if self.world_size == 1:
            return x
        if self.fast_all_reduce is not None and self.fast_all_reduce.accepts(x):
            return self.fast_all_reduce.all_reduce(x)
        import torch.distributed as dist

        dist.all_reduce(x, group=self.device_group)
        return x

    def fuses_norm(self, x: torch.Tensor) -> bool:
        """Whether the sum of ``x`` over the ranks can be fused with the residual add and RMSNorm after it."""
        fused = getattr(self.fast_all_reduce, "fused_norm", None)
        return fused is not None and x.is_cuda and fused.accepts(x)

    def all_reduce_add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                                eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """``s = all_reduce(x) + residual`` -> ``(rmsnorm(s) * weight, s)`` in one kernel (``fuses_norm``)."""
        return self.fast_all_reduce.fused_norm(x, residual, weight, eps)

    def all_gather_last_dim(self, x: torch.Tensor) -> torch.Tensor:
        """[..., s] on every rank -> [..., world_size * s], rank 0's columns first."""
        if self.world_size == 1:
            return x
        import torch.distributed as dist

        x = x.contiguous()
        # Gathering into one buffer concatenates along dim 0, the only layout gloo and NCCL share.
        out = torch.empty((self.world_size * x.shape[0],) + tuple(x.shape[1:]), dtype=x.dtype, device=x.device)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in torch 2.13
        gather(out, x, group=self.device_group)
        out = out.view(self.world_size, *x.shape)  # [W, ..., s]
        return out.movedim(0, -2).reshape(*x.shape[:-1], self.world_size * x.shape[-1])

    def broadcast_tensor(self, x: torch.Tensor) -> torch.Tensor:
        """Rank 0's ``x`` into every rank's ``x`` (same shape and dtype everywhere), over the device group."""
        if self.world_size == 1:
            return x
        import torch.distributed as dist

        dist.broadcast(x, src=0, group=self.device_group)
        return x

    def broadcast_object(self, obj: Any = None) -> Any:
        """Rank 0 sends ``obj`` (any picklable value); every rank returns it."""
        if self.world_size == 1:
            return obj
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.control_group)
        return box[0]

    def min_int(self, value: int) -> int:
        """The smallest ``value`` over the ranks (host integers, over the control group)."""
        if self.world_size == 1:
            return value
        import torch.distributed as dist

        t = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.control_group)
        return int(t.item())


SINGLE = TPGroup(rank=0, world_size=1)


def init_tp_group(rank: int, world_size: int, init_method: str, device: torch.device) -> TPGroup:
    """Join the rendezvous at ``init_method`` (blocks until every rank has joined)."""
    import torch.distributed as dist

    if dist.is_initialized():
        raise TensorParallelError("torch.distributed is already initialised in this process: "
                                  "only one tensor-parallel engine may run per process")
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)  # NCCL binds this thread's current device
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=DEVICE_TIMEOUT_S))
    control = dist.new_group(backend="gloo", timeout=_CONTROL_TIMEOUT)
    group = TPGroup(rank=rank, world_size=world_size, device_group=dist.group.WORLD, control_group=control)
    # NCCL builds its communicator at the first collective; that must not happen inside a CUDA-graph
    # capture, so do one now.
    group.all_reduce(torch.zeros(1, device=device))
    from aioinfer.distributed.symm_all_reduce import SymmMemAllReduce

    # Collective on every device type (None off CUDA), so that the CPU tests run the ranks' vote too.
    return dataclasses.replace(group, fast_all_reduce=SymmMemAllReduce.create(dist.group.WORLD, control, device))


def destroy_tp_group(timeout_s: float = 15.0) -> bool:
    """Tear down this process's groups, so that another engine may start later. Idempotent.

    NCCL communicators are aborted, not destroyed: a graceful NCCL teardown may wait for peers that
    are gone and for CUDA graphs that captured its kernels. The teardown runs on a helper thread,
    and after ``timeout_s`` it is left behind with a warning rather than hanging the caller;
    returns False then (the group stays registered, so no new engine can start in this process).
    """
    import threading

    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    if not (dist.is_available() and dist.is_initialized()):
        return True
    abort = getattr(distributed_c10d, "_abort_process_group", None)  # private, but public torch has no other
    teardown = abort if dist.get_backend() == "nccl" and abort is not None else dist.destroy_process_group
    thread = threading.Thread(target=teardown, name="aioinfer-tp-teardown", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        logger.warning("tensor-parallel process group teardown did not finish within %.0f s; left behind", timeout_s)
        return False
    return True
