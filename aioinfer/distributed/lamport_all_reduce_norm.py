"""Tensor-parallel decode: the all-reduce after a row-parallel layer, the residual add and the
RMSNorm after it, as ONE Triton kernel over symmetric memory with no barrier at all ("Lamport"
all-reduce, as TensorRT-LLM names it).

Why: a barrier version (one kernel, one cross-GPU barrier; removed, in git history) measured 6.1
us a call at 7b TP=2 batch 1 on two H200s, the same as torch's one-shot all-reduce alone: a
system-scope fence, a remote compare-and-swap round trip and a flag wait cost more than the few KB
they guard. This one takes 3.7-4.2 us for 1-8 rows, against 7.8-8.8 for the one-shot all-reduce
plus the norm kernel (benchmarks/probes/tp_all_reduce_norm.py). Here the data is its own flag:

- every buffer starts filled with a sentinel, negative zero (bits 0x8000 in bf16), which no sent
  value carries: a rank sends -0.0 as +0.0 (a bit test; ``x + 0.0`` may be folded away) and every
  other value as it is;
- a call writes this rank's rows into its part of the call's slot in every peer's buffer (remote
  stores over NVLink, nothing waits for them), then re-reads its own buffer's peer parts until no
  element holds the sentinel: each element arrives whole, so an element that is not the sentinel
  is the peer's value (its own rows it keeps in registers);
- it sums the parts in rank order (float32, one rounding: bit-equal to NCCL for 2 ranks), adds
  the residual, applies the RMSNorm (rounding as layers/triton_ops/rms_norm.py);
- it refills with the sentinel the slot two calls back. Three slots make that safe: a peer writes
  into slot (n + 2) % 3 only in call n + 2, which needs this rank's rows of call n + 1, which this
  rank sends only after the kernel of call n (and its refill) has completed.

One program per row, and each row is a channel of its own, with its own device counter that picks
its slot (so CUDA-graph replays go round the slots too): a single program for 8 rows spilled its
registers (23 us a call against 3.7 for one row). Both ranks run the same calls with the same row
counts, so the counters agree. Ranks can be at most one call apart on a row (a rank cannot finish
call n + 1 without its peers' row of call n + 1).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_ROWS = 8
_SLOTS = 3
_SENTINEL_BITS = {torch.bfloat16: -0x8000, torch.float16: -0x8000, torch.float32: -0x80000000}  # -0.0
_INT_VIEW = {torch.bfloat16: tl.int16, torch.float16: tl.int16, torch.float32: tl.int32}


@triton.jit
def _lamport_all_reduce_add_rms_norm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, buffer_ptrs, slot_ptr,
    stride_x, stride_r, eps, part_elems,
    N: tl.constexpr, BLOCK: tl.constexpr, RANK: tl.constexpr, WORLD: tl.constexpr,
    SENTINEL: tl.constexpr, INT_T: tl.constexpr,
):
    row = tl.program_id(0)  # one program per row, each with its own slot counter: rows are independent channels
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    dtype = x.dtype
    bits = x.to(INT_T, bitcast=True)
    x = tl.where(bits == SENTINEL, 0, bits).to(INT_T).to(dtype, bitcast=True)  # -0.0 -> +0.0: never the sentinel
    slot_index = tl.load(slot_ptr + row)
    slot_elems = WORLD * part_elems  # a slot: one part per rank, row r of a part at r * N
    slot = slot_index.to(tl.int64) * slot_elems
    here = row * N + cols
    bufs = buffer_ptrs.to(tl.pointer_type(tl.uint64))
    for r in tl.static_range(WORLD):
        if r != RANK:  # a rank reads its own row from registers
            dst = tl.load(bufs + r).to(tl.pointer_type(dtype))
            tl.store(dst + slot + RANK * part_elems + here, x, mask=mask)

    mine = tl.load(bufs + RANK).to(tl.pointer_type(dtype))
    # Refill the slot of two calls back (see the module docstring) with the sentinel now: nobody
    # touches it during this call, and the stores drain while the peers' rows travel.
    stale = ((slot_index + 2) % 3).to(tl.int64) * slot_elems  # call n - 1's, = call n + 2's
    sentinel = tl.full([BLOCK], SENTINEL, INT_T).to(dtype, bitcast=True)
    for r in tl.static_range(WORLD):
        if r != RANK:
            tl.store(mine + stale + r * part_elems + here, sentinel, mask=mask)

    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for r in tl.static_range(WORLD):  # rank order on every rank: the same bits everywhere
        if r == RANK:
            acc += x.to(tl.float32)
        else:
            src = mine + slot + r * part_elems + here
            v = tl.load(src, mask=mask, other=0.0, volatile=True)
            missing = tl.sum(((v.to(INT_T, bitcast=True) == SENTINEL) & mask).to(tl.int32), axis=0)
            while missing > 0:
                v = tl.load(src, mask=mask, other=0.0, volatile=True)
                missing = tl.sum(((v.to(INT_T, bitcast=True) == SENTINEL) & mask).to(tl.int32), axis=0)
            acc += v.to(tl.float32)

    total = acc.to(dtype)  # the all-reduced activation, rounded once
    res = tl.load(res_ptr + row * stride_r + cols, mask=mask, other=0.0)
    h = (total.to(tl.float32) + res.to(tl.float32)).to(dtype)
    tl.store(res_out_ptr + row * N + cols, h, mask=mask)
    hf = h.to(tl.float32)
    var = tl.sum(hf * hf, axis=0) / N
    y = (hf * tl.math.rsqrt(var + eps)).to(dtype)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    tl.store(out_ptr + row * N + cols, (w.to(tl.float32) * y.to(tl.float32)).to(dtype), mask=mask)
    tl.store(slot_ptr + row, (slot_index + 1) % 3)


class LamportAllReduceNorm:
    """``(rmsnorm(all_reduce(x) + residual) * w, all_reduce(x) + residual)`` for rows <= MAX_ROWS."""

    def __init__(self, handles: dict[torch.dtype, object], slot: torch.Tensor, rank: int, world_size: int,
                 part_bytes: int) -> None:
        self._handles = handles  # dtype -> torch _SymmetricMemory of this module's own buffer
        self._slot = slot  # int32 [MAX_ROWS] on the device: each row's next slot, 0..2
        self._rank, self._world = rank, world_size
        self._part_bytes = part_bytes  # one rank's rows in one slot
        self.num_warps = 8  # benchmarks/probes/tp_all_reduce_norm.py compares others

    def accepts(self, x: torch.Tensor) -> bool:
        return (x.dtype in self._handles and x.dim() == 2 and 0 < x.shape[0] <= MAX_ROWS and x.stride(-1) == 1
                and x.numel() * x.element_size() <= self._part_bytes)

    def __call__(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float):
        rows, n = x.shape
        handle = self._handles[x.dtype]
        out = torch.empty((rows, n), dtype=x.dtype, device=x.device)
        res_out = torch.empty((rows, n), dtype=x.dtype, device=x.device)
        _lamport_all_reduce_add_rms_norm_kernel[(rows,)](
            x, residual, weight, out, res_out, handle.buffer_ptrs_dev, self._slot,
            x.stride(0), residual.stride(0), float(eps), self._part_bytes // x.element_size(),
            N=n, BLOCK=triton.next_power_of_2(n), RANK=self._rank, WORLD=self._world, SENTINEL=_SENTINEL_BITS[x.dtype], INT_T=_INT_VIEW[x.dtype],
            num_warps=self.num_warps)
        return out, res_out

    @classmethod
    def create(cls, group_name: str, device: torch.device, rank: int, world_size: int, max_bytes: int,
               dtypes) -> "LamportAllReduceNorm":
        """Collective: one symmetric buffer per dtype (three slots, each ``world_size`` parts of
        ``max_bytes``), filled with the sentinel. The caller must make every rank finish ``create``
        (device work included) before any rank calls the kernel."""
        import torch.distributed._symmetric_memory as symm_mem

        handles = {}
        for dtype in dtypes:
            buffer = symm_mem.empty(_SLOTS * world_size * max_bytes // dtype.itemsize, dtype=dtype, device=device)
            buffer.fill_(-0.0)
            handles[dtype] = symm_mem.rendezvous(buffer, group_name)
        torch.cuda.synchronize(device)
        return cls(handles, torch.zeros(MAX_ROWS, dtype=torch.int32, device=device), rank, world_size, max_bytes)
