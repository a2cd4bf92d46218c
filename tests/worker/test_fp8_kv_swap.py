"""The fp8 KV cache in the worker: its size (one byte a value: twice the blocks of bf16 in the same
memory, and so of the swap pool) and swap preemption moving its blocks bit for bit through a host
pool of the same dtype, on CPU (CI) and on CUDA (pinned memory, the copy stream; marked `gpu`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from aioinfer import LLM
from aioinfer.attention.fp8_kv import FP8_DTYPE, raw_bytes
from aioinfer.config import EngineConfig
from aioinfer.core.scheduler_output import SchedulerOutput, SwapIn, SwapOut
from aioinfer.worker.kv_cache import KVCacheSpec, choose_num_blocks
from aioinfer.worker.swap import num_host_blocks_for
from tiny_models import make_tiny_model_dir

BLOCK_SIZE = 4
NUM_KV_BLOCKS = 64


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return make_tiny_model_dir(tmp_path_factory.mktemp("fp8swap"), arch="qwen2")


def test_fp8_blocks_are_half_of_bf16_ones():
    bf16 = KVCacheSpec(num_layers=28, block_size=16, num_kv_heads=4, head_dim=128, dtype=torch.bfloat16)
    fp8 = KVCacheSpec(num_layers=28, block_size=16, num_kv_heads=4, head_dim=128, dtype=FP8_DTYPE)
    assert fp8.bytes_per_block * 2 == bf16.bytes_per_block == 917504
    config = EngineConfig.from_kwargs("m", cpu_kv_cache_gib=1.0, max_num_seqs=4096, preemption_mode="swap",
                                      swap_space_gib=2.0, kv_cache_dtype="fp8")
    cpu = torch.device("cpu")
    # twice, give or take the block the floor of the division drops
    assert 0 <= choose_num_blocks(config, fp8, cpu, 32768) - 2 * choose_num_blocks(config, bf16, cpu, 32768) <= 1
    assert 0 <= num_host_blocks_for(config, fp8) - 2 * num_host_blocks_for(config, bf16) <= 1


def _swaps_only(swap_out=(), swap_in=()) -> SchedulerOutput:
    return SchedulerOutput(scheduled=[], new_requests=[], finished_request_ids=[], num_scheduled_tokens=0,
                           swap_out=list(swap_out), swap_in=list(swap_in))


def _fill_random_bytes(runner, seed: int) -> None:
    """Every byte value, NaN patterns included: a swap copies bytes, whatever they mean."""
    gen = torch.Generator().manual_seed(seed)
    for pair in runner.kv_caches:
        for cache in pair:
            raw_bytes(cache).copy_(torch.randint(0, 256, cache.shape, generator=gen, dtype=torch.uint8))


def _blocks(runner, block_ids) -> list[torch.Tensor]:
    index = torch.tensor(block_ids, device=runner.device)
    return [raw_bytes(t).index_select(0, index).cpu() for pair in runner.kv_caches for t in pair]


def _round_trip(runner) -> None:
    assert runner.spec.dtype == FP8_DTYPE and runner.swapper.host.dtype == FP8_DTYPE
    _fill_random_bytes(runner, seed=1)
    a_blocks, b_blocks = (17, 3, 42, 8, 9), (60, 61, 0)
    a_data, b_data = _blocks(runner, a_blocks), _blocks(runner, b_blocks)
    runner.launch(_swaps_only(swap_out=[SwapOut("a", a_blocks, 5), SwapOut("b", b_blocks, 31)]))
    if runner.swapper.is_cuda:
        runner.swapper.synchronize()
    host = runner.swapper.host
    for i, block in enumerate(a_blocks):  # the host run holds every layer's K and V of each block
        for layer, (keys, values) in enumerate(runner.kv_caches):
            assert torch.equal(raw_bytes(host[5 + i, layer, 0]), raw_bytes(keys[block]).cpu())
            assert torch.equal(raw_bytes(host[5 + i, layer, 1]), raw_bytes(values[block]).cpu())
    _fill_random_bytes(runner, seed=2)  # the freed blocks are written by other requests
    new_a, new_b = (60, 0, 33, 17, 1), (3, 42, 63)
    runner.launch(_swaps_only(swap_in=[SwapIn("b", 31, new_b)]))
    runner.launch(_swaps_only(swap_in=[SwapIn("a", 5, new_a)]))
    if runner.swapper.is_cuda:
        torch.cuda.synchronize()
    for got, want in zip(_blocks(runner, new_a), a_data, strict=True):
        assert torch.equal(got, want)
    for got, want in zip(_blocks(runner, new_b), b_data, strict=True):
        assert torch.equal(got, want)
    timings = runner.take_swap_timings() if not runner.swapper.is_cuda else []
    assert all(t.num_bytes == t.num_blocks * runner.spec.bytes_per_block for t in timings)


def test_fp8_swap_round_trip_restores_every_byte(model_dir):
    llm = LLM(model=str(model_dir), dtype="float32", device="cpu", block_size=BLOCK_SIZE,
              num_kv_blocks=NUM_KV_BLOCKS, preemption_mode="swap", swap_space_gib=0.001, kv_cache_dtype="fp8")
    runner = llm.engine.executor.runner
    assert runner.num_host_blocks >= 40
    _round_trip(runner)


@pytest.mark.gpu
def test_gpu_fp8_swap_round_trip_restores_every_byte(model_dir):
    llm = LLM(model=str(model_dir), dtype="bfloat16", device="cuda", block_size=BLOCK_SIZE,
              num_kv_blocks=NUM_KV_BLOCKS, preemption_mode="swap", swap_space_gib=0.001, kv_cache_dtype="fp8",
              enforce_eager=True)
    runner = llm.engine.executor.runner
    assert runner.swapper.is_cuda and runner.swapper.host.is_pinned()
    _round_trip(runner)
