"""The Lamport all-reduce + residual add + RMSNorm kernel (distributed/lamport_all_reduce_norm.py)
under the Triton interpreter, on CPU, with the peer simulated: rank 0 runs the kernel while the
test plays rank 1 by writing its rows into rank 0's buffer, as rank 1's kernel would.

What this checks of the protocol: rows go to the peer's buffer only, at this rank's part of the
call's slot, with -0.0 sent as +0.0 (the sentinel is -0.0); the sum, add and norm; the refill of
the slot two calls back with the sentinel; one slot counter per row, going round three slots.
The two-GPU run (tests/executor/test_tensor_parallel.py, marked gpu) checks it against NCCL on real memory.
The interpreter rounds float32 -> bfloat16 by truncation, so only float32 is compared bit for bit.
"""

from __future__ import annotations

import os

import pytest
import torch

if torch.cuda.is_available():
    pytest.skip("runs under the Triton interpreter on CPU (two GPUs: tests/executor/test_tensor_parallel.py)",
                allow_module_level=True)
os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernel module is imported
pytest.importorskip("triton")

from aioinfer.distributed import lamport_all_reduce_norm as lamport  # noqa: E402

if type(lamport._lamport_all_reduce_add_rms_norm_kernel).__name__ != "InterpretedFunction":
    pytest.skip("the kernel module was imported without the interpreter", allow_module_level=True)


class _Handle:
    """What the kernel reads of torch's symmetric-memory handle: the buffers' addresses."""

    def __init__(self, buffers: list[torch.Tensor]) -> None:
        self.buffer_ptrs_dev = torch.tensor([b.data_ptr() for b in buffers], dtype=torch.int64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rank0_of_two_against_a_simulated_peer(dtype):
    world, rows, n, eps = 2, 3, 96, 1e-6
    part_bytes = lamport.MAX_ROWS * 128 * 4
    part = part_bytes // dtype.itemsize  # elements of one rank's part of a slot
    buffers = [torch.full((3 * world * part,), -0.0, dtype=dtype) for _ in range(world)]
    op = lamport.LamportAllReduceNorm({dtype: _Handle(buffers)}, torch.zeros(lamport.MAX_ROWS, dtype=torch.int32),
                                      0, world, part_bytes)
    g = torch.Generator().manual_seed(0)
    weight = (1 + 0.1 * torch.randn(n, generator=g)).to(dtype)
    for call in range(4):  # slots 0, 1, 2, 0
        slot = call % 3
        x = torch.randn(rows, n, generator=g).to(dtype)
        x[0, :3] = -0.0
        residual = torch.randn(rows, n, generator=g).to(dtype)
        peer = torch.randn(rows, n, generator=g).to(dtype)
        peer_part = slot * world * part + part  # rank 1's part of this slot in rank 0's buffer
        buffers[0][peer_part: peer_part + rows * n] = peer.flatten()

        out, s = op(x, residual, weight, eps)

        want_s = ((x.float() + peer.float()).to(dtype).float() + residual.float()).to(dtype)
        want_out = (weight.float() * (want_s.float() * torch.rsqrt(want_s.float().pow(2).mean(-1, keepdim=True) + eps))
                    .to(dtype).float()).to(dtype)
        if dtype == torch.float32:
            torch.testing.assert_close(s, want_s, rtol=0, atol=0)
            torch.testing.assert_close(out, want_out, rtol=2e-6, atol=1e-6)
        else:
            torch.testing.assert_close(s, want_s, rtol=2e-2, atol=5e-2)
            torch.testing.assert_close(out, want_out, rtol=3e-2, atol=5e-2)
        sent = buffers[1][slot * world * part: slot * world * part + rows * n].view(rows, n)  # rank 0's part at rank 1
        assert torch.equal(sent, x) and not torch.signbit(sent[0, :3]).any()  # -0.0 went as +0.0
        own = buffers[0][slot * world * part: slot * world * part + rows * n]
        assert torch.signbit(own).all() and (own == 0).all()  # rank 0 never writes its own part
        stale = (slot + 2) % 3  # call n - 1's slot, refilled for call n + 2
        stale_peer = buffers[0][stale * world * part + part: stale * world * part + part + rows * n]
        assert torch.signbit(stale_peer).all() and (stale_peer == 0).all()
    assert op._slot.tolist() == [1] * rows + [0] * (lamport.MAX_ROWS - rows)  # 4 calls: each row at slot 1


def test_accepts_only_what_it_can_hold():
    op = lamport.LamportAllReduceNorm({torch.bfloat16: None}, torch.zeros(lamport.MAX_ROWS, dtype=torch.int32),
                                      0, 2, 8 * 64 * 2)
    assert op.accepts(torch.zeros(8, 64, dtype=torch.bfloat16))
    assert not op.accepts(torch.zeros(9, 64, dtype=torch.bfloat16))  # more rows than counters
    assert not op.accepts(torch.zeros(8, 65, dtype=torch.bfloat16))  # larger than a part
    assert not op.accepts(torch.zeros(1, 64, dtype=torch.float32))  # no buffer of that dtype
    assert not op.accepts(torch.zeros(4, 64, dtype=torch.bfloat16)[:, ::2])  # strided columns
