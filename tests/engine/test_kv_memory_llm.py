"""KV memory management on the real model path (tiny random HF models, CPU, float32, greedy):
prefix hits, cache salts, priorities and forced preemption in both modes are token-identical to
transformers, and the cached-token counts reach RequestOutput, deltas and request stats."""

from __future__ import annotations

import random

import pytest
import torch

from aioinfer import LLM, SamplingParams
from tiny_models import make_tiny_model_dir

MAX_TOKENS = 10
BLOCK = 8


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def model(request, tmp_path_factory):
    """(model dir, prompts sharing long prefixes, transformers' greedy continuation of each)."""
    from transformers import AutoModelForCausalLM

    path = make_tiny_model_dir(tmp_path_factory.mktemp(request.param), arch=request.param)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    rng = random.Random(7)
    system = [rng.randrange(400) for _ in range(45)]
    prompts = [system[:n] + [rng.randrange(400) for _ in range(k)]
               for n, k in ((45, 3), (45, 11), (40, 1), (24, 9), (45, 19), (16, 2), (45, 3), (33, 7))]
    prompts += [[rng.randrange(400) for _ in range(n)] for n in (5, 29, 52)]
    expected = []
    with torch.no_grad():
        for p in prompts:
            out = hf.generate(torch.tensor([p]), max_new_tokens=MAX_TOKENS, do_sample=False,
                              attention_mask=torch.ones(1, len(p), dtype=torch.long))
            expected.append(out[0, len(p):].tolist())
    return path, prompts, expected


GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)


def _llm(path, **kwargs) -> LLM:
    return LLM(model=str(path), dtype="float32", device="cpu", block_size=BLOCK, **kwargs)


def _tokens(outputs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outputs]


def test_prefix_hits_give_the_cold_run_tokens(model):
    path, prompts, expected = model
    llm = _llm(path, max_num_batched_tokens=64)
    # One at a time, so that each prompt finds what the earlier ones left in the cache.
    cold = [llm.generate([p], GREEDY, use_tqdm=False)[0] for p in prompts]
    assert _tokens(cold) == expected
    assert cold[0].num_cached_tokens == 0 and cold[1].num_cached_tokens == 40  # the 45-token system prompt
    assert sum(o.num_cached_tokens for o in cold) > 0
    warm = llm.generate(prompts, GREEDY, use_tqdm=False)  # everything again, in one batch
    assert _tokens(warm) == expected
    for prompt, out in zip(prompts, warm):
        assert out.num_cached_tokens == (len(prompt) - 1) // BLOCK * BLOCK
    off = _llm(path, max_num_batched_tokens=64, enable_prefix_caching=False)
    again = off.generate(prompts, GREEDY, use_tqdm=False)
    assert _tokens(again) == expected and all(o.num_cached_tokens == 0 for o in again)


def test_cache_salt_keeps_tenants_apart(model):
    path, prompts, expected = model
    llm = _llm(path)
    prompt = prompts[4]  # 64 tokens
    runs = [llm.generate([prompt], GREEDY, use_tqdm=False, cache_salt=salt)[0] for salt in ("a", "b", None, "a", "b")]
    assert [r.num_cached_tokens for r in runs] == [0, 0, 0, 56, 56]
    assert all(r.outputs[0].token_ids == expected[4] for r in runs)
    with pytest.raises(ValueError, match="cache_salt"):
        llm.generate([prompt], GREEDY, use_tqdm=False, cache_salt="")


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_forced_preemption_with_priorities_and_shared_prefixes(model, mode, async_scheduling):
    path, prompts, expected = model
    # 14 usable blocks of 8 tokens: the longest request fits alone, far from all of them at once.
    llm = _llm(path, num_kv_blocks=15, max_num_batched_tokens=48, preemption_mode=mode, swap_space_gib=0.01,
               async_scheduling=async_scheduling)
    priorities = [i % 3 - 1 for i in range(len(prompts))]
    outputs = llm.generate(prompts, GREEDY, use_tqdm=False, priority=priorities)
    assert _tokens(outputs) == expected
    scheduler = llm.engine.scheduler
    assert scheduler.num_preemptions > 0
    assert sum(o.num_cached_tokens for o in outputs) > 0
    if mode == "swap":
        assert scheduler.num_swapped_out > 0 and scheduler.num_swapped_in == scheduler.num_swapped_out
    else:
        assert scheduler.num_swapped_out == 0
    scheduler.check_invariants()
    assert llm.engine.kv_cache.all_free() and scheduler.host_pool.all_free()


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.mark.anyio
async def test_async_engine_reports_cached_tokens_and_accepts_salt_and_priority(model):
    from aioinfer import Engine

    path, prompts, expected = model

    class Stats:
        def __init__(self):
            self.done = {}

        def on_step(self, stats):
            pass

        def on_request_done(self, stats):
            self.done[stats.request_id] = stats.num_cached_tokens

        def on_rejected(self, reason):
            pass

    observer = Stats()
    async with Engine(str(path), dtype="float32", device="cpu", block_size=BLOCK, observers=[observer]) as engine:
        async def run(request_id, **kwargs):
            tokens, last = [], None
            async for delta in engine.generate(prompts[1], GREEDY, request_id=request_id, **kwargs):
                tokens += delta.token_ids
                last = delta
            return tokens, last.num_cached_tokens

        first = await run("first", priority=2)
        second = await run("second", priority=-1)
        other_tenant = await run("salted", cache_salt="tenant-x")
        with pytest.raises(ValueError, match="cache_salt"):
            engine.generate(prompts[1], GREEDY, cache_salt="")
    warm = (len(prompts[1]) - 1) // BLOCK * BLOCK
    assert first == (expected[1], 0) and second == (expected[1], warm) and other_tenant == (expected[1], 0)
    assert {k: v for k, v in observer.done.items() if k != "aioinfer-warm-up"} == \
        {"first": 0, "second": warm, "salted": 0}
