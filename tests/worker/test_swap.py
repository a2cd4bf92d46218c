"""Swap preemption, device side, on CPU: the real ModelRunner's caches and host pool, the real copies.

- sizing: no host pool unless preemption_mode is "swap"; its block count follows swap_space_gib;
- a swap-out then swap-in round trip restores every byte, with non-contiguous (and reused) device
  blocks and runs at different host offsets, through ``ModelRunner.launch`` with nothing to compute;
- one step that both swaps in from a host run and swaps out into it (the scheduler freed the run at
  swap-in) and hands the swapped-out blocks to the swapped-in request gets both orders right;
- timings reach StepStats' Prometheus histograms;
- end to end: greedy tokens with forced swap preemption equal transformers', with a roomy and an
  almost full host pool (recompute when a victim does not fit), synchronous and async scheduling;
  seeded sampling with penalties gives the tokens of a run without preemption (runner state kept);
  through the async Engine, the swap timings reach the Prometheus histograms.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from aioinfer import LLM, SamplingParams
from aioinfer.config import EngineConfig
from aioinfer.core.scheduler_output import SchedulerOutput, SwapIn, SwapOut
from aioinfer.worker.kv_cache import KVCacheSpec
from aioinfer.worker.swap import num_host_blocks_for
from engine_streams import generate_all
from tiny_models import make_tiny_model_dir

BLOCK_SIZE = 4
NUM_KV_BLOCKS = 64
HOST_BLOCKS = 40


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return make_tiny_model_dir(tmp_path_factory.mktemp("swap"), arch="qwen2")


def _swap_llm(model_dir: Path, host_blocks: int = HOST_BLOCKS) -> LLM:
    return LLM(model=str(model_dir), dtype="float32", device="cpu", block_size=BLOCK_SIZE,
               num_kv_blocks=NUM_KV_BLOCKS, preemption_mode="swap",
               swap_space_gib=_gib_for(model_dir, host_blocks, BLOCK_SIZE))


def _gib_for(model_dir: Path, num_blocks: int, block_size: int) -> float:
    """swap_space_gib that holds exactly ``num_blocks`` float32 blocks of the model."""
    import json

    cfg = json.loads((model_dir / "config.json").read_text())
    head_dim = cfg["hidden_size"] // cfg["num_attention_heads"]
    spec = KVCacheSpec(cfg["num_hidden_layers"], block_size, cfg["num_key_value_heads"], head_dim, torch.float32)
    return num_blocks * spec.bytes_per_block / 2**30


def _swaps_only(swap_out=(), swap_in=()) -> SchedulerOutput:
    return SchedulerOutput(scheduled=[], new_requests=[], finished_request_ids=[], num_scheduled_tokens=0,
                           swap_out=list(swap_out), swap_in=list(swap_in))


def _fill_random(runner, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for keys, values in runner.kv_caches:
        keys.copy_(torch.randn(keys.shape, generator=gen))
        values.copy_(torch.randn(values.shape, generator=gen))


def _blocks(runner, block_ids) -> list[torch.Tensor]:
    """Every layer's K and V of ``block_ids`` (copies), in order."""
    index = torch.tensor(block_ids)
    return [t.index_select(0, index).clone() for pair in runner.kv_caches for t in pair]


def _assert_blocks_equal(runner, block_ids, expected: list[torch.Tensor]) -> None:
    for got, want in zip(_blocks(runner, block_ids), expected, strict=True):
        assert torch.equal(got.view(torch.int32), want.view(torch.int32))  # bit for bit


# ----------------------------------------------------------------------------- sizing


def test_host_pool_only_in_swap_mode(model_dir):
    spec = KVCacheSpec(num_layers=28, block_size=16, num_kv_heads=4, head_dim=128, dtype=torch.bfloat16)
    assert spec.bytes_per_block == 917504  # qwen2.5-7b: 0.875 MiB per block
    swap = EngineConfig.from_kwargs("m", preemption_mode="swap", swap_space_gib=4.0)
    assert num_host_blocks_for(swap, spec) == 4 * 2**30 // 917504
    assert num_host_blocks_for(EngineConfig.from_kwargs("m", preemption_mode="swap", swap_space_gib=0), spec) == 0
    assert num_host_blocks_for(EngineConfig.from_kwargs("m", swap_space_gib=4.0), spec) == 0  # recompute

    llm = LLM(model=str(model_dir), dtype="float32", device="cpu", block_size=BLOCK_SIZE, num_kv_blocks=NUM_KV_BLOCKS)
    assert llm.engine.executor.runner.num_host_blocks == 0 and llm.engine.executor.runner.swapper is None
    with pytest.raises(RuntimeError, match="no host pool"):
        llm.engine.executor.runner.launch(_swaps_only(swap_out=[SwapOut("r", (1, 2), 0)]))

    runner = _swap_llm(model_dir).engine.executor.runner
    assert runner.num_host_blocks == HOST_BLOCKS
    layers, heads, head_dim = runner.spec.num_layers, runner.spec.num_kv_heads, runner.spec.head_dim
    assert runner.swapper.host.shape == (HOST_BLOCKS, layers, 2, BLOCK_SIZE, heads, head_dim)
    assert runner.swapper.timer_backend == "host"


# ----------------------------------------------------------------------------- round trips


def test_round_trip_restores_every_byte(model_dir):
    runner = _swap_llm(model_dir).engine.executor.runner
    _fill_random(runner, seed=1)
    a_blocks, b_blocks = (17, 3, 42, 8, 9), (60, 61, 0)  # unordered, non-contiguous, block 0 included
    a_data, b_data = _blocks(runner, a_blocks), _blocks(runner, b_blocks)
    untouched = [b for b in range(NUM_KV_BLOCKS) if b not in (*a_blocks, *b_blocks)]
    untouched_data = _blocks(runner, untouched)

    launched = runner.launch(_swaps_only(swap_out=[SwapOut("a", a_blocks, 5), SwapOut("b", b_blocks, 31)]))
    assert runner.collect(launched).sampled_token_ids == []  # swaps alone: nothing sampled
    _assert_blocks_equal(runner, untouched, untouched_data)  # a swap-out reads, never writes, the cache

    # The host run is laid out block by block with every layer's K and V: check it directly.
    host = runner.swapper.host
    for i, block in enumerate(a_blocks):
        for layer, (keys, values) in enumerate(runner.kv_caches):
            assert torch.equal(host[5 + i, layer, 0], keys[block]) and torch.equal(host[5 + i, layer, 1], values[block])

    # The freed blocks go to other requests, which write them: overwrite the whole cache.
    _fill_random(runner, seed=2)
    # Back into different blocks, partly each other's old ones, in separate steps.
    new_a, new_b = (60, 0, 33, 17, 1), (3, 42, 63)
    runner.launch(_swaps_only(swap_in=[SwapIn("b", 31, new_b)]))
    runner.launch(_swaps_only(swap_in=[SwapIn("a", 5, new_a)]))
    _assert_blocks_equal(runner, new_a, a_data)
    _assert_blocks_equal(runner, new_b, b_data)

    timings = runner.take_swap_timings()
    assert [(t.direction, t.num_blocks) for t in timings] == [("out", 5), ("out", 3), ("in", 3), ("in", 5)]
    assert all(t.num_bytes == t.num_blocks * runner.spec.bytes_per_block and t.seconds > 0 for t in timings)
    assert runner.take_swap_timings() == []  # taken once


def test_same_step_swap_in_and_out_share_host_run_and_device_blocks(model_dir):
    """Swap-in reads host run R before the step's swap-out overwrites R; swap-out reads its device
    blocks before the swap-in scatters into them (both freed and reused within one step)."""
    runner = _swap_llm(model_dir).engine.executor.runner
    _fill_random(runner, seed=3)
    a_blocks = (4, 11, 23)
    a_data = _blocks(runner, a_blocks)
    runner.launch(_swaps_only(swap_out=[SwapOut("a", a_blocks, 10)]))
    _fill_random(runner, seed=4)
    c_blocks = (7, 50, 2)
    c_data = _blocks(runner, c_blocks)
    runner.launch(_swaps_only(swap_out=[SwapOut("c", c_blocks, 10)], swap_in=[SwapIn("a", 10, c_blocks)]))
    _assert_blocks_equal(runner, c_blocks, a_data)  # a got its own KV, not c's
    _fill_random(runner, seed=5)
    runner.launch(_swaps_only(swap_in=[SwapIn("c", 10, (30, 31, 32))]))
    _assert_blocks_equal(runner, (30, 31, 32), c_data)  # and the host run now held c's


def test_random_swaps_keep_every_request_intact(model_dir):
    """Many requests swapped out and in at random offsets and block sets, several per step."""
    runner = _swap_llm(model_dir).engine.executor.runner
    rng = random.Random(0)
    _fill_random(runner, seed=6)
    free_device = list(range(NUM_KV_BLOCKS))
    rng.shuffle(free_device)
    owned: dict[str, tuple[int, ...]] = {}  # request -> its device blocks
    for i in range(6):
        n = rng.randint(1, 7)
        owned[f"r{i}"], free_device = tuple(free_device[:n]), free_device[n:]
    expected = {rid: _blocks(runner, blocks) for rid, blocks in owned.items()}
    host_free = list(range(HOST_BLOCKS))  # kept as sorted ids: runs are carved from the front
    on_host: dict[str, tuple[int, int]] = {}  # request -> (host start, length)
    for _ in range(30):
        outs, ins = [], []
        for rid in rng.sample(sorted(owned), k=rng.randint(0, min(2, len(owned)))):  # swap out
            n = len(owned[rid])
            start = _take_run(host_free, n)
            if start is None:
                continue
            outs.append(SwapOut(rid, owned.pop(rid), start))
            on_host[rid] = (start, n)
        released = [b for s in outs for b in s.device_block_ids]  # reusable in this very step
        free_device = released + free_device
        candidates = sorted(set(on_host) - {s.request_id for s in outs})
        for rid in rng.sample(candidates, k=rng.randint(0, min(2, len(candidates)))):
            start, n = on_host.pop(rid)
            blocks, free_device = tuple(free_device[:n]), free_device[n:]
            ins.append(SwapIn(rid, start, blocks))
            owned[rid] = blocks
            host_free.extend(range(start, start + n))
            host_free.sort()
        runner.launch(_swaps_only(outs, ins))
        # Whatever is free now gets written by others.
        for block in free_device:
            for keys, values in runner.kv_caches:
                keys[block].normal_()
                values[block].normal_()
        for rid, blocks in owned.items():
            _assert_blocks_equal(runner, blocks, expected[rid])
    assert runner.swapper.totals["out"][0] > 10 and runner.swapper.totals["in"][0] > 10


def _take_run(free: list[int], n: int):
    """First contiguous run of ``n`` free host blocks (removed from ``free``), or None."""
    for i in range(len(free) - n + 1):
        if free[i + n - 1] - free[i] == n - 1:
            start = free[i]
            del free[i:i + n]
            return start
    return None


# ----------------------------------------------------------------------------- metrics


def test_swap_timings_reach_prometheus():
    from aioinfer.async_engine.stats import StepStats, SwapTiming
    from aioinfer.metrics import PrometheusMetrics

    metrics = PrometheusMetrics("m")
    swaps = (SwapTiming("out", 64, 64 << 20, 0.0025), SwapTiming("in", 64, 64 << 20, 0.005),
             SwapTiming("out", 1, 1 << 20, 0.001))
    metrics.on_step(StepStats(num_running=1, num_waiting=1, kv_usage=0.5, num_batched_requests=1,
                              num_scheduled_tokens=1, num_generation_tokens=1, num_preempted=1, step_time=0.01,
                              swaps=swaps))

    def sample(name: str, direction: str, **extra) -> float:
        return metrics.registry.get_sample_value(name, {"model_name": "m", "engine": "0", "direction": direction,
                                                        **extra})

    assert sample("aioinfer:kv_swap_bytes_count", "out") == 2
    assert sample("aioinfer:kv_swap_bytes_sum", "out") == (64 << 20) + (1 << 20)
    assert sample("aioinfer:kv_swap_seconds_sum", "in") == 0.005
    # 64 MiB in 2.5 ms is 26.8 GB/s and 1 MiB in 1 ms 1.05 GB/s: one at most 25 GB/s, both at most 30.
    assert sample("aioinfer:kv_swap_bandwidth_gbps_bucket", "out", le="25.0") == 1
    assert sample("aioinfer:kv_swap_bandwidth_gbps_bucket", "out", le="30.0") == 2
    assert SwapTiming("out", 1, 10**9, 0.5).gb_per_s == 2.0


# ----------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def greedy_reference(request, tmp_path_factory):
    """(model dir, prompts, transformers' greedy continuations)."""
    from transformers import AutoModelForCausalLM

    path = make_tiny_model_dir(tmp_path_factory.mktemp(request.param), arch=request.param)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    rng = random.Random(0)
    prompts = [[rng.randrange(400) for _ in range(n)] for n in (70, 5, 33, 47, 16, 21, 64, 8, 55, 13)]
    expected = []
    with torch.no_grad():
        for p in prompts:
            out = hf.generate(torch.tensor([p]), max_new_tokens=E2E_MAX_TOKENS, do_sample=False,
                              attention_mask=torch.ones(1, len(p), dtype=torch.long))
            expected.append(out[0, len(p):].tolist())
    return path, prompts, expected


E2E_MAX_TOKENS = 12


@pytest.mark.parametrize("host_blocks", [64, 6], ids=["roomy-host-pool", "host-pool-mostly-full"])
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_swap_preemption_matches_transformers(greedy_reference, host_blocks, async_scheduling):
    path, prompts, expected = greedy_reference
    # 14 usable blocks of 8 tokens: the longest request fits alone, far from all of them at once.
    llm = LLM(model=str(path), dtype="float32", device="cpu", block_size=8, num_kv_blocks=15,
              max_num_batched_tokens=48, preemption_mode="swap", swap_space_gib=_gib_for(path, host_blocks, 8),
              async_scheduling=async_scheduling)
    assert llm.engine.executor.runner.num_host_blocks == host_blocks
    outputs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=E2E_MAX_TOKENS), use_tqdm=False)
    got = [o.outputs[0].token_ids for o in outputs]
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        assert g == e, f"prompt {i}: engine {g} != transformers {e}"
    assert llm.engine.scheduler.num_preemptions > 0
    totals = llm.engine.executor.runner.swapper.totals
    if host_blocks == 64:  # room for any victim: preemption swaps
        assert totals["out"][0] > 0, "no request was swapped out: the test did not exercise swapping"
    assert totals["in"][0] == totals["out"][0], "every swapped-out request must come back"


def test_swapped_request_keeps_its_sampling_state(greedy_reference):
    """Seeded sampling and penalties read the runner's per-request state (seed, tokens so far, pending
    count): a swapped-out request keeps it, so its tokens equal those of a run without preemption."""
    path, prompts, _ = greedy_reference
    params = SamplingParams(temperature=0.9, top_p=0.95, seed=1234, repetition_penalty=1.3, presence_penalty=0.5,
                            max_tokens=E2E_MAX_TOKENS, ignore_eos=True)
    roomy = LLM(model=str(path), dtype="float32", device="cpu", block_size=8, num_kv_blocks=256)
    expected = [o.outputs[0].token_ids for o in roomy.generate(prompts, params, use_tqdm=False)]
    assert roomy.engine.scheduler.num_preemptions == 0
    squeezed = LLM(model=str(path), dtype="float32", device="cpu", block_size=8, num_kv_blocks=15,
                   max_num_batched_tokens=48, preemption_mode="swap", swap_space_gib=_gib_for(path, 64, 8))
    got = [o.outputs[0].token_ids for o in squeezed.generate(prompts, params, use_tqdm=False)]
    assert squeezed.engine.executor.runner.swapper.totals["out"][0] > 0
    assert got == expected


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.mark.anyio
async def test_async_engine_reports_swaps_to_prometheus(greedy_reference):
    """Through the GPU thread and the step loop: StepStats carry the swap timings to the histograms."""
    from aioinfer import Engine
    from aioinfer.metrics import PrometheusMetrics

    path, prompts, expected = greedy_reference
    metrics = PrometheusMetrics("m")
    params = SamplingParams(temperature=0.0, max_tokens=E2E_MAX_TOKENS)
    async with Engine(str(path), dtype="float32", device="cpu", block_size=8, num_kv_blocks=15,
                      max_num_batched_tokens=48, preemption_mode="swap", swap_space_gib=_gib_for(path, 64, 8),
                      observers=[metrics]) as engine:
        results = await generate_all(engine, prompts, params)
        totals = engine._core.executor.runner.swapper.totals
    assert results == expected
    assert totals["out"][0] > 0

    def count(direction: str) -> float:
        return metrics.registry.get_sample_value(
            "aioinfer:kv_swap_seconds_count", {"model_name": "m", "engine": "0", "direction": direction}) or 0

    # On CPU every copy is timed as it runs, so each one reaches the step's StepStats.
    assert count("out") == totals["out"][0] and count("in") == totals["in"][0]
    bandwidth = metrics.registry.get_sample_value(
        "aioinfer:kv_swap_bandwidth_gbps_sum", {"model_name": "m", "engine": "0", "direction": "out"})
    assert bandwidth > 0
