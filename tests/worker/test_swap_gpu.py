"""Swap preemption on CUDA (marked gpu: skipped without a GPU).

- round trips of >= 64 MiB of bf16 KV in qwen2.5-7b shapes (28 layers, 4 KV heads, head_dim 128)
  preserve every byte, while the freed device blocks are overwritten right after the swap-out is
  enqueued (no sync in between: the gather must be ordered before the step's writes);
- ``swap`` returns before its copy has run (nothing in it waits on the device);
- cuda-python events time every copy with sane, positive numbers;
- the engine with forced swap preemption gives the same greedy tokens as without preemption.
"""

from __future__ import annotations

import random
import time

import pytest
import torch

from aioinfer.core.scheduler_output import SwapIn, SwapOut
from aioinfer.worker.kv_cache import KVCacheSpec, allocate_kv_caches
from aioinfer.worker.swap import KVSwapper

pytestmark = pytest.mark.gpu

SPEC_7B = KVCacheSpec(num_layers=28, block_size=16, num_kv_heads=4, head_dim=128, dtype=torch.bfloat16)
BLOCK_BYTES = SPEC_7B.bytes_per_block  # 0.875 MiB
NUM_DEVICE_BLOCKS = 640  # 560 MiB
NUM_HOST_BLOCKS = 400  # 350 MiB


@pytest.fixture(scope="module")
def swapper():
    device = torch.device("cuda")
    caches = allocate_kv_caches(SPEC_7B, NUM_DEVICE_BLOCKS, device)
    swapper = KVSwapper(caches, SPEC_7B, NUM_HOST_BLOCKS, device)
    yield swapper
    swapper.close()


def _randomize(swapper: KVSwapper, seed: int) -> None:
    """Random bit patterns (NaNs and infinities included): the comparisons are on the raw bits."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    for pair in swapper.kv_caches:
        for t in pair:
            t.view(torch.int16).copy_(torch.randint(-2**15, 2**15, t.shape, dtype=torch.int16, device="cuda",
                                                    generator=gen))


def _snapshot(swapper: KVSwapper, block_ids) -> list[torch.Tensor]:
    index = torch.tensor(block_ids, device="cuda")
    return [t.index_select(0, index).view(torch.int16).clone() for pair in swapper.kv_caches for t in pair]


def _assert_bits_equal(swapper: KVSwapper, block_ids, expected) -> None:
    for got, want in zip(_snapshot(swapper, block_ids), expected, strict=True):
        assert torch.equal(got, want)


def test_round_trip_preserves_every_byte(swapper):
    swapper.synchronize()
    swapper.take_timings()
    rng = random.Random(0)
    ids = list(range(NUM_DEVICE_BLOCKS))
    rng.shuffle(ids)
    a_blocks, b_blocks = tuple(ids[:96]), tuple(ids[96:176])  # 84 MiB and 70 MiB, scattered
    assert len(a_blocks) * BLOCK_BYTES >= 64 * 2**20
    _randomize(swapper, seed=1)
    a_data, b_data = _snapshot(swapper, a_blocks), _snapshot(swapper, b_blocks)

    swapper.swap([SwapOut("a", a_blocks, 7), SwapOut("b", b_blocks, 200)], [])
    _randomize(swapper, seed=2)  # the next forward writes the freed blocks: no sync before it

    # Back into other blocks, B partly into A's old ones, A into B's.
    rng.shuffle(ids)
    new_a = tuple(ids[:96])
    new_b = tuple(b for b in ids[96:] if b not in new_a)[:80]
    swapper.swap([], [SwapIn("a", 7, new_a), SwapIn("b", 200, new_b)])
    _assert_bits_equal(swapper, new_a, a_data)  # reads on the compute stream, after the scatter
    _assert_bits_equal(swapper, new_b, b_data)

    swapper.synchronize()
    host = swapper.host[7:7 + 96].view(torch.int16)  # [blocks, layers, 2, block_size, heads, head_dim]
    for layer in range(SPEC_7B.num_layers):
        assert torch.equal(host[:, layer, 0], a_data[2 * layer].cpu())
        assert torch.equal(host[:, layer, 1], a_data[2 * layer + 1].cpu())
    assert [(t.direction, t.num_blocks) for t in swapper.take_timings()] == [
        ("out", 96), ("out", 80), ("in", 96), ("in", 80)]


def test_same_step_swap_in_and_swap_out_share_a_host_run_and_device_blocks(swapper):
    _randomize(swapper, seed=3)
    a_blocks = tuple(range(100, 180))
    a_data = _snapshot(swapper, a_blocks)
    swapper.swap([SwapOut("a", a_blocks, 0)], [])
    _randomize(swapper, seed=4)
    c_blocks = tuple(range(300, 380, 1))
    c_data = _snapshot(swapper, c_blocks)
    # One step: a comes back into c's blocks from run 0, c goes out into run 0 (freed by a's swap-in).
    swapper.swap([SwapOut("c", c_blocks, 0)], [SwapIn("a", 0, c_blocks)])
    _assert_bits_equal(swapper, c_blocks, a_data)
    _randomize(swapper, seed=5)
    swapper.swap([], [SwapIn("c", 0, tuple(range(500, 580)))])
    _assert_bits_equal(swapper, tuple(range(500, 580)), c_data)
    swapper.synchronize()
    swapper.take_timings()


def test_swap_does_not_wait_for_its_copy(swapper):
    swapper.synchronize()
    swapper.take_timings()
    blocks = tuple(range(0, 2 * 293, 2))  # 256 MiB
    torch.cuda._sleep(200_000_000)  # ~0.1 s of device work ahead of the gather on the compute stream
    t0 = time.perf_counter()
    swapper.swap([SwapOut("x", blocks, 0)], [])
    enqueue_s = time.perf_counter() - t0
    swapper.poll()
    assert swapper._in_flight, "the swap-out copy finished before swap() returned: something waited"
    assert not swapper.timer.done(swapper._in_flight[-1].end)
    assert enqueue_s < 0.05, enqueue_s
    swapper.synchronize()
    (timing,) = swapper.take_timings()
    assert timing.num_bytes == 293 * BLOCK_BYTES


def test_cuda_python_timings_are_sane(swapper):
    assert swapper.timer_backend == "cuda-python", "cuda-python (cuda.bindings) is missing: pip install 'aioinfer[cuda]'"
    swapper.synchronize()
    swapper.take_timings()
    results = {}
    for mib in (16, 64, 256):
        n = -(-mib * 2**20 // BLOCK_BYTES)
        blocks = tuple(random.Random(mib).sample(range(NUM_DEVICE_BLOCKS), n))
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        swapper.swap([SwapOut("t", blocks, 3)], [])
        swapper.swap([], [SwapIn("t", 3, blocks)])
        swapper.synchronize()
        wall = time.perf_counter() - t0
        out, back = swapper.take_timings()
        assert (out.direction, back.direction) == ("out", "in")
        for t in (out, back):
            assert t.num_blocks == n and t.num_bytes == n * BLOCK_BYTES
            assert 0 < t.seconds < wall, (t, wall)  # a copy is timed inside the host's window around it
            assert 1.0 < t.gb_per_s < 1000.0, t  # pinned DMA: well above pageable rates, below any bus
        results[mib] = (out.gb_per_s, back.gb_per_s)
    print("swap GB/s (out, in) by MiB:", {k: (round(a, 1), round(b, 1)) for k, (a, b) in results.items()})


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(400) for _ in range(rng.choice([5, 16, 17, 33, 47, 64, 70]))] for _ in range(n)]


@pytest.mark.parametrize("enforce_eager", [True, False], ids=["eager", "cuda-graphs"])
def test_swapped_requests_resume_with_identical_tokens(tmp_path, enforce_eager):
    from aioinfer import LLM, SamplingParams
    from tiny_models import make_tiny_model_dir

    path = make_tiny_model_dir(tmp_path, arch="qwen2")
    prompts = _prompts(12)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    common = dict(model=str(path), dtype="float32", device="cuda", attention_backend="triton", block_size=8,
                  max_num_batched_tokens=48, enforce_eager=enforce_eager)
    roomy = LLM(**common, num_kv_blocks=512)
    expected = [o.outputs[0].token_ids for o in roomy.generate(prompts, params, use_tqdm=False)]
    assert roomy.engine.scheduler.num_preemptions == 0
    del roomy
    # 15 blocks of 8 tokens: one request at full length (70 + 24 tokens) fits, twelve do not.
    swapping = LLM(**common, num_kv_blocks=15, preemption_mode="swap", swap_space_gib=0.01)
    got = [o.outputs[0].token_ids for o in swapping.generate(prompts, params, use_tqdm=False)]
    assert got == expected
    swapper = swapping.engine.executor.runner.swapper
    swapper.synchronize()
    assert swapper.totals["out"][0] > 0, "nothing was swapped out: the test did not exercise swapping"
    assert swapper.totals["in"][0] == swapper.totals["out"][0]
    timings = swapping.engine.take_swap_timings()
    assert timings and all(t.seconds > 0 for t in timings)
