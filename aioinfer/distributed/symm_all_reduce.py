"""One-shot all-reduce over torch symmetric memory, for the small sums of decode steps (on by
default on CUDA; ``AIOINFER_TP_SYMM_MEM=0`` keeps NCCL for every sum).

A batch-1 decode step of a 28-layer model does 57 all-reduces of a few KB; each NCCL all-reduce
costs a fixed latency far above its bandwidth cost. Here every rank copies its tensor into its
slot of a buffer that every other rank can read directly (CUDA peer memory), meets the others at
a barrier, and sums all slots itself: ``torch.ops.symm_mem.one_shot_all_reduce_copy_out``, one
kernel. Never the multimem (NVLink multicast) operations: they are forbidden on our machines,
so this module also turns multicast off before the buffers are made.

- On when no rank sets ``AIOINFER_TP_SYMM_MEM=0``, every rank sits on one host and runs on CUDA
  at a world size the kernel supports, and the buffers rendezvous; otherwise NCCL. A warning says
  why only where ``AIOINFER_TP_SYMM_MEM=1`` asked for it explicitly.
- Decode rows (up to 8) of a row-parallel layer skip this path: the Lamport kernel of
  lamport_all_reduce_norm.py sums them together with the residual add and RMSNorm that follow
  (``AIOINFER_TP_FUSED_NORM=0`` turns it off, for A/B runs).
- Which path a tensor takes depends only on its dtype and size, the same on every rank: ranks
  that disagreed would wait in different collectives for ever.
- Every rank gets the same bits: each sums the slots in rank order (not its own slot first), so
  the sampled tokens, which look-ahead steps reuse on each rank (executor/tensor_parallel.py), stay identical.
- Once per process per group name: torch registers a group's symmetric-memory store under the
  group's name for the life of the process and refuses to register the name again (checked on
  CPU: ``_SymmetricMemory.set_group_info`` raises the second time), while its Python side silently
  keeps the first store. A second tensor-parallel engine in the same process gets the same WORLD
  name ("0") with a new store and a fresh worker process, so the two ranks met in different stores
  and waited for ever: the hang of the two-GPU tests run in one pytest process. A name this process
  has already used now makes every rank fall back to NCCL, with a warning.
- CUDA graphs: the kernel reads its peers through fixed buffer addresses and synchronises through
  signal pads that each barrier leaves as it found them, so it is captured and replayed like the
  NCCL kernels. ``tests/executor/test_tensor_parallel.py -m gpu`` checks it against NCCL, eager and inside
  a graph (passed on two H200s, 2026-11-29).
"""

from __future__ import annotations

import logging
import os
import socket
import warnings
import zlib

import torch

logger = logging.getLogger(__name__)

ENV_FLAG = "AIOINFER_TP_SYMM_MEM"
_MAX_BYTES = int(os.environ.get("AIOINFER_TP_SYMM_MEM_MAX_KIB", "512")) * 1024  # 64 x 3584 bf16 = 448 KiB
_DTYPES = (torch.bfloat16, torch.float32)  # what the kernel dispatches on
_WORLD_SIZES = (2, 4, 8)
_ALIGNMENT = 16  # bytes: the kernel's widest vector, so every size below takes the same path
_FUSED_NORM_FLAG = "AIOINFER_TP_FUSED_NORM"  # "0": keep the all-reduce and the RMSNorm apart (A/B runs)
_FUSED_MAX_BYTES = 8 * 8192 * 4  # one rank's part of a slot: 8 rows of up to 8192 float32 values
_USED_GROUP_NAMES: set[str] = set()  # names this process registered with torch's symmetric memory


class SymmMemAllReduce:
    """``all_reduce(x)`` for tensors that ``accepts``; build with ``create`` (collective)."""

    def __init__(self, group_name: str, buffers: dict[torch.dtype, torch.Tensor], fused_norm=None) -> None:
        self._group_name = group_name
        self._buffers = buffers
        # LamportAllReduceNorm (lamport_all_reduce_norm.py): the sum, residual add and RMSNorm of
        # decode rows in one kernel; None where it could not be set up.
        self.fused_norm = fused_norm

    def accepts(self, x: torch.Tensor) -> bool:
        nbytes = x.numel() * x.element_size()
        return x.dtype in self._buffers and 0 < nbytes <= _MAX_BYTES and nbytes % _ALIGNMENT == 0

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum over the ranks, in a new tensor (``x`` is left as it was)."""
        if not x.is_contiguous() or x.data_ptr() % _ALIGNMENT:
            x = x.clone(memory_format=torch.contiguous_format)  # fresh allocations are aligned
        slot = self._buffers[x.dtype][: x.numel()].view_as(x)
        out = torch.empty_like(x)
        return torch.ops.symm_mem.one_shot_all_reduce_copy_out(slot, x, "sum", self._group_name, out)

    @classmethod
    def create(cls, device_group, control_group, device: torch.device) -> SymmMemAllReduce | None:
        """Collective over both groups; None (use NCCL) unless every rank can and wants to."""
        import torch.distributed as dist

        requested = os.environ.get(ENV_FLAG, "")
        wanted, explicit = requested != "0", requested == "1"
        name_free = device_group.group_name not in _USED_GROUP_NAMES
        if explicit and not name_free:
            logger.warning("%s=1 ignored: this process already set up symmetric memory for process group %r "
                           "(an earlier tensor-parallel engine); torch cannot register the name again", ENV_FLAG,
                           device_group.group_name)
        usable = (wanted and name_free and device.type == "cuda"
                  and dist.get_world_size(device_group) in _WORLD_SIZES and _has_op())
        if not _all_agree(usable, control_group):
            if explicit and name_free:
                logger.warning("%s=1 ignored: symmetric memory needs every rank to ask for it, on CUDA devices "
                               "of one host, at world size 2, 4 or 8, with torch's symm_mem operations", ENV_FLAG)
            return None
        try:
            buffers, ok = _rendezvous_buffers(device_group.group_name, device), True
        except Exception as exc:  # noqa: BLE001 - optional fast path; NCCL still works
            logger.warning("symmetric-memory all-reduce unavailable, using NCCL: %s", exc)
            buffers, ok = {}, False
        if not _all_agree(ok, control_group):
            return None
        logger.info("tensor parallel: one-shot symmetric-memory all-reduce up to %d KiB", _MAX_BYTES // 1024)
        fused = None
        if os.environ.get(_FUSED_NORM_FLAG, "1") == "1":
            try:
                from aioinfer.distributed.lamport_all_reduce_norm import LamportAllReduceNorm

                fused = LamportAllReduceNorm.create(device_group.group_name, device, dist.get_rank(device_group),
                                                    dist.get_world_size(device_group), _FUSED_MAX_BYTES, _DTYPES)
            except Exception as exc:  # noqa: BLE001 - optional; the one-shot all-reduce still works
                logger.warning("fused all-reduce + RMSNorm unavailable: %s", exc)
                fused = None
            if not _all_agree(fused is not None, control_group):  # also: every rank's buffers are ready
                fused = None
        return cls(device_group.group_name, buffers, fused)


def _all_agree(yes: bool, control_group) -> bool:
    """True on every rank if every rank says yes and all run on one host (one collective)."""
    import torch.distributed as dist

    host = zlib.crc32(socket.gethostname().encode())
    votes = torch.tensor([int(yes), host, -host], dtype=torch.int64)
    dist.all_reduce(votes, op=dist.ReduceOp.MIN, group=control_group)
    return bool(votes[0]) and int(votes[1]) == -int(votes[2])  # min(host) == max(host)


def _has_op() -> bool:
    try:
        return hasattr(torch.ops.symm_mem, "one_shot_all_reduce_copy_out")
    except Exception:  # noqa: BLE001 - a build without symmetric memory
        return False


def _rendezvous_buffers(group_name: str, device: torch.device) -> dict[torch.dtype, torch.Tensor]:
    # Multicast objects are never needed here, and creating one is forbidden on our machines.
    os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
    import torch.distributed._symmetric_memory as symm_mem

    _USED_GROUP_NAMES.add(group_name)  # from here on torch may hold state under this name, even if a step fails
    enable = getattr(symm_mem, "enable_symm_mem_for_group", None)  # needed by older torch only
    if enable is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            enable(group_name)
    buffers = {}
    for dtype in _DTYPES:
        buffer = symm_mem.empty(_MAX_BYTES // dtype.itemsize, dtype=dtype, device=device)
        symm_mem.rendezvous(buffer, group_name)
        buffers[dtype] = buffer
    return buffers
