"""Tensor-parallel decode: the all-reduce after a row-parallel layer, the residual add and the
RMSNorm that follow it, as ONE Triton kernel over symmetric memory (opt-in with the one-shot path,
``AIOINFER_TP_SYMM_MEM=1``; only for a few rows).

UNTESTED ON GPUS (written when no device time was left): run tests/test_tensor_parallel.py -m gpu
and benchmarks.decode_latency --tensor-parallel-size 2 before trusting it.

Why: at TP=2 a batch-1 step of 7b does 57 all-reduces (torch's one-shot kernel, 6.2 us each: a
copy-in, two cross-GPU barriers, the sum) and 56 separate add+RMSNorm kernels (~2.1 us each), which
do not shrink with the split while the weight reads halve: TP=2 sat at 0.71x TP=1 (docs/performance.md).

One program per call (a decode row is a few KB):
  1. copy this rank's partial rows into its symmetric buffer, in the slot of this call's parity;
  2. one cross-GPU barrier (release/acquire at system scope on the signal pad);
  3. sum every rank's slot in rank order (float32, one rounding: bit-equal to NCCL for 2 ranks),
     add the residual, RMSNorm, as layers/triton_ops/rms_norm.py rounds;
  4. flip the parity (a device counter, so CUDA-graph replays alternate too).
Two slots make the one barrier enough: a rank writes a slot again only two calls later, after it
passed the barrier of the call in between, which its peers reach only once they finished reading.
The buffers are this module's own (torch's one-shot op copies into its buffer before its barrier,
so sharing one would race) and the barrier uses signal-pad words torch's ops do not touch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_ROWS = 8
_SIGNAL_BASE = 2048  # first signal-pad word (uint32) used here; torch's own barriers use the first ones


@triton.jit
def _flat_tid():
    return tl.inline_asm_elementwise(
        """
        {
            .reg .u32 %a, %b;
            mov.u32 %a, %tid.y;
            mov.u32 %b, %ntid.x;
            mul.lo.u32 %a, %a, %b;
            mov.u32 %b, %tid.x;
            add.u32 $0, %a, %b;
        }
        """,
        "=r", [], dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def _barrier(signal_pad_ptrs, RANK: tl.constexpr, WORLD: tl.constexpr, BASE: tl.constexpr):
    """Every rank's program meets here. Thread r < WORLD (one element of ``ranks`` each: a tensor
    smaller than the block is replicated over the threads, hence the thread test) flags rank r's pad
    word [BASE + RANK] 0 -> 1 (release, after a system fence that covers the block's earlier stores)
    and clears its own word [BASE + r] 1 -> 0 once rank r flagged it; the pads end as they began, so
    the barrier needs no counter and replays in CUDA graphs."""
    ranks = tl.arange(0, WORLD)
    pads = signal_pad_ptrs.to(tl.pointer_type(tl.uint64))
    remote = tl.load(pads + ranks).to(tl.pointer_type(tl.uint32)) + BASE + RANK
    local = tl.load(pads + RANK).to(tl.pointer_type(tl.uint32)) + BASE + ranks
    tl.debug_barrier()  # the block's stores happen before thread r's fence and release
    if _flat_tid() < WORLD:
        tl.inline_asm_elementwise(
            """
            {
                .reg .u32 %old;
                .reg .pred %p;
                fence.acq_rel.sys;
            send:
                atom.global.release.sys.cas.b32 %old, [$1], 0, 1;
                setp.eq.u32 %p, %old, 0;
                @!%p bra send;
            wait:
                atom.global.acquire.sys.cas.b32 %old, [$2], 1, 0;
                setp.eq.u32 %p, %old, 1;
                @!%p bra wait;
                mov.u32 $0, %old;
            }
            """,
            "=r, l, l", [remote, local], dtype=tl.int32, is_pure=False, pack=1)
    tl.debug_barrier()
    # Every thread acquires what each rank released before it reads the peers' slots.
    mine = tl.load(pads + RANK).to(tl.pointer_type(tl.uint32)) + BASE
    for r in tl.static_range(WORLD):
        tl.inline_asm_elementwise("ld.acquire.sys.global.u32 $0, [$1];", "=r, l", [mine + r], dtype=tl.int32,
                                  is_pure=False, pack=1)


@triton.jit
def _all_reduce_add_rms_norm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, buffer_ptrs, signal_pad_ptrs, parity_ptr,
    M, stride_x, stride_r, eps, slot_elems,
    N: tl.constexpr, BLOCK: tl.constexpr, M_PAD: tl.constexpr, RANK: tl.constexpr, WORLD: tl.constexpr,
    BASE: tl.constexpr,
):
    rows = tl.arange(0, M_PAD)
    cols = tl.arange(0, BLOCK)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    dense = rows[:, None] * N + cols[None, :]
    x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
    dtype = x.dtype
    parity = tl.load(parity_ptr)
    slot = parity.to(tl.int64) * slot_elems
    bufs = buffer_ptrs.to(tl.pointer_type(tl.uint64))
    mine = tl.load(bufs + RANK).to(tl.pointer_type(dtype))
    tl.store(mine + slot + dense, x, mask=mask)
    _barrier(signal_pad_ptrs, RANK, WORLD, BASE)
    acc = tl.zeros([M_PAD, BLOCK], dtype=tl.float32)
    for r in tl.static_range(WORLD):  # rank order on every rank: the same bits everywhere
        peer = tl.load(bufs + r).to(tl.pointer_type(dtype))
        acc += tl.load(peer + slot + dense, mask=mask, other=0.0, cache_modifier=".cv").to(tl.float32)
    total = acc.to(dtype)  # the all-reduced activation, rounded once
    res = tl.load(res_ptr + rows[:, None] * stride_r + cols[None, :], mask=mask, other=0.0)
    h = (total.to(tl.float32) + res.to(tl.float32)).to(dtype)
    tl.store(res_out_ptr + dense, h, mask=mask)
    hf = h.to(tl.float32)
    var = tl.sum(hf * hf, axis=1) / N
    y = (hf * tl.math.rsqrt(var + eps)[:, None]).to(dtype)
    w = tl.load(w_ptr + cols, mask=cols < N, other=0.0)
    tl.store(out_ptr + dense, (w.to(tl.float32)[None, :] * y.to(tl.float32)).to(dtype), mask=mask)
    tl.store(parity_ptr, 1 - parity)


class FusedAllReduceNorm:
    """``(rmsnorm(all_reduce(x) + residual) * w, all_reduce(x) + residual)`` for rows <= MAX_ROWS."""

    def __init__(self, handles: dict[torch.dtype, object], parity: torch.Tensor, rank: int, world_size: int) -> None:
        self._handles = handles  # dtype -> torch _SymmetricMemory of this module's own buffer
        self._parity = parity  # int32 [1] on the device: this rank's next slot
        self._rank, self._world = rank, world_size

    def accepts(self, x: torch.Tensor) -> bool:
        handle = self._handles.get(x.dtype)
        return (handle is not None and x.dim() == 2 and 0 < x.shape[0] <= MAX_ROWS and x.stride(-1) == 1
                and 2 * x.numel() * x.element_size() <= handle.buffer_size)

    def __call__(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float):
        rows, n = x.shape
        handle = self._handles[x.dtype]
        out = torch.empty((rows, n), dtype=x.dtype, device=x.device)
        res_out = torch.empty((rows, n), dtype=x.dtype, device=x.device)
        _all_reduce_add_rms_norm_kernel[(1,)](
            x, residual, weight, out, res_out, handle.buffer_ptrs_dev, handle.signal_pad_ptrs_dev, self._parity,
            rows, x.stride(0), residual.stride(0), float(eps), handle.buffer_size // (2 * x.element_size()),
            N=n, BLOCK=triton.next_power_of_2(n), M_PAD=triton.next_power_of_2(rows), RANK=self._rank,
            WORLD=self._world, BASE=_SIGNAL_BASE, num_warps=8)
        return out, res_out

    @classmethod
    def create(cls, group_name: str, device: torch.device, rank: int, world_size: int, max_bytes: int,
               dtypes) -> "FusedAllReduceNorm":
        """Collective: one symmetric buffer per dtype (two slots of ``max_bytes``)."""
        import torch.distributed._symmetric_memory as symm_mem

        handles = {}
        for dtype in dtypes:
            buffer = symm_mem.empty(2 * max_bytes // dtype.itemsize, dtype=dtype, device=device)
            handle = symm_mem.rendezvous(buffer, group_name)
            if handle.signal_pad_size < 4 * (_SIGNAL_BASE + world_size):
                raise RuntimeError(f"signal pad of {handle.signal_pad_size} bytes is too small")
            handles[dtype] = handle
        return cls(handles, torch.zeros(1, dtype=torch.int32, device=device), rank, world_size)
