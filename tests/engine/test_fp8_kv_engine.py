"""The offline LLM with an fp8 KV cache (``kv_cache_dtype="fp8"``) on every scheduler path, tiny random
models on CPU (float32 weights, the torch backend): chunked prefill, prefix-cache hits, preemption by
recompute and by swap (the host pool in fp8 too), n-gram drafts (their proposals from the true
continuation, tests/spec_oracle.py, as random weights seldom copy their prompt), prompt logprobs,
async scheduling.

Each path runs to completion and frees every block (the suite's autouse check besides the asserts
here), and gives the greedy tokens of the plain fp8 run: a block's fp8 bytes do not depend on how its
tokens were scheduled (chunk, hit, swap round trip), so neither do the tokens read from it. fp8 and
float32 caches are not held to equal tokens here (a tiny random model's next-token margins are
below fp8's rounding); tests/models/test_fp8_kv_perplexity.py holds a real model's quality.
"""

from __future__ import annotations

import random

import pytest

from aioinfer import LLM, SamplingParams
from aioinfer.attention.fp8_kv import FP8_DTYPE
from aioinfer.metrics_reader import Gauge
from spec_oracle import install_oracle
from tiny_models import make_tiny_model_dir

MAX_TOKENS = 10
BLOCK = 8
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
PATHS = {
    "chunked prefill": dict(max_num_batched_tokens=24),
    "preemption by recompute": dict(num_kv_blocks=15, max_num_batched_tokens=48),
    "preemption by swap": dict(num_kv_blocks=15, max_num_batched_tokens=48, preemption_mode="swap",
                               swap_space_gib=0.01),
    "n-gram drafts": dict(speculative_config=NGRAM),
    "drafts, chunked, preempting": dict(speculative_config=NGRAM, num_kv_blocks=15, max_num_batched_tokens=32),
    "async scheduling": dict(async_scheduling=True, max_num_batched_tokens=24),
}


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def model(request, tmp_path_factory):
    """(model dir, prompts: shared prefixes, repeats for n-gram drafts, block-boundary lengths)."""
    path = make_tiny_model_dir(tmp_path_factory.mktemp(request.param), arch=request.param)
    rng = random.Random(3)
    system = [rng.randrange(400) for _ in range(33)]
    prompts = [system + [rng.randrange(400) for _ in range(k)] for k in (1, 7, 15)]
    motif = [rng.randrange(400) for _ in range(5)]
    prompts += [motif * 6, [rng.randrange(400) for _ in range(BLOCK)], [rng.randrange(400) for _ in range(61)]]
    return path, prompts


def _llm(path, **kwargs) -> LLM:
    return LLM(model=str(path), dtype="float32", device="cpu", block_size=BLOCK, kv_cache_dtype="fp8", **kwargs)


def _tokens(outputs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outputs]


@pytest.fixture(scope="module")
def plain(model):
    path, prompts = model
    llm = _llm(path)
    runner = llm.engine.executor.runner
    assert runner.spec.dtype == FP8_DTYPE and all(k.dtype == FP8_DTYPE for pair in runner.kv_caches for k in pair)
    outputs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert all(len(t) == MAX_TOKENS for t in _tokens(outputs))
    return _tokens(outputs)


@pytest.fixture
def drafts_pay(monkeypatch):
    """Drafts always pay (spec_decode/payoff.py measures this machine's timings otherwise)."""
    from aioinfer.spec_decode import payoff

    monkeypatch.setattr(payoff.DraftPayoff, "prefers_drafts", lambda self, num_running: True)


@pytest.mark.parametrize("path_name", list(PATHS))
def test_every_scheduler_path_gives_the_plain_fp8_tokens(model, plain, path_name, drafts_pay, monkeypatch):
    path, prompts = model
    if "drafts" in path_name:  # random weights seldom copy their prompt: drafts from the true continuation
        install_oracle(monkeypatch, {tuple(p): out for p, out in zip(prompts, plain)})
    llm = _llm(path, **PATHS[path_name])
    assert _tokens(llm.generate(prompts, GREEDY, use_tqdm=False)) == plain
    scheduler = llm.engine.scheduler
    if "preempt" in path_name:
        assert scheduler.num_preemptions > 0
    if "swap" in path_name:
        assert scheduler.num_swapped_out > 0 and scheduler.num_swapped_in == scheduler.num_swapped_out
        assert llm.engine.executor.runner.swapper.host.dtype == FP8_DTYPE
        assert scheduler.host_pool.all_free()
    if "drafts" in path_name:  # drafts verified against the fp8 cache, some accepted, some rolled back
        totals = scheduler.draft_policy.totals
        assert 0 < totals.num_accepted_tokens < totals.num_draft_tokens
    scheduler.check_invariants()
    assert llm.engine.kv_cache.all_free()


def test_prefix_cache_hits_read_the_cached_fp8_blocks(model, plain):
    path, prompts = model
    llm = _llm(path, max_num_batched_tokens=64)
    cold = [llm.generate([p], GREEDY, use_tqdm=False)[0] for p in prompts]  # each finds the earlier ones' blocks
    assert _tokens(cold) == plain
    assert cold[1].num_cached_tokens == 32 and cold[2].num_cached_tokens == 32  # the 33-token shared prefix
    warm = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert _tokens(warm) == plain
    assert all(o.num_cached_tokens == (len(p) - 1) // BLOCK * BLOCK for p, o in zip(prompts, warm))
    assert llm.engine.kv_cache.all_free()


def test_prompt_logprobs_with_chunks_and_hits(model, plain):
    path, prompts = model
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, prompt_logprobs=1)
    reference = _llm(path).generate(prompts, params, use_tqdm=False)
    llm = _llm(path, max_num_batched_tokens=24)
    llm.generate(prompts[:1], GREEDY, use_tqdm=False)  # a cached prefix a request with prompt logprobs must not use
    chunked = llm.generate(prompts, params, use_tqdm=False)
    assert _tokens(chunked) == plain == _tokens(reference)
    for want, got, prompt in zip(reference, chunked, prompts):
        assert got.prompt_logprobs[0] is None and len(got.prompt_logprobs) == len(prompt)
        for a, b in zip(want.prompt_logprobs[1:], got.prompt_logprobs[1:]):
            assert a.keys() == b.keys()
            assert all(abs(a[t].logprob - b[t].logprob) < 1e-4 for t in a)
    assert llm.engine.kv_cache.all_free()


def test_the_pool_holds_four_times_the_float32_tokens_and_metrics_say_fp8(model):
    path, _ = model
    sizes = {}
    for kv in ("auto", "fp8"):
        llm = LLM(model=str(path), dtype="float32", device="cpu", block_size=BLOCK, kv_cache_dtype=kv,
                  cpu_kv_cache_gib=0.0005, max_model_len=512)
        sizes[kv] = llm.engine.executor.num_kv_blocks
        info = [m for m in llm.get_metrics() if m.name == "vllm:cache_config_info"]
        assert len(info) == 1 and isinstance(info[0], Gauge) and info[0].value == 1
        assert info[0].labels["cache_dtype"] == kv
        assert info[0].labels["num_gpu_blocks"] == str(sizes[kv]) and info[0].labels["block_size"] == str(BLOCK)
    assert sizes["fp8"] == 4 * sizes["auto"]  # one byte a value against float32's four


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_gpu_fp8_tokens_equal_eager_and_with_cuda_graphs_on_every_path(tmp_path, arch):
    """float32 weights (so that graph and eager runs round alike) over an fp8 cache on the Triton
    kernels: the CUDA-graph run (decode and small prefill steps replayed, the scales baked in) gives
    the eager run's tokens, and so do chunked prefill, prefix hits, swap and recompute preemption."""
    path = make_tiny_model_dir(tmp_path, arch=arch)
    rng = random.Random(5)
    system = [rng.randrange(400) for _ in range(40)]
    prompts = [system + [rng.randrange(400) for _ in range(k)] for k in (1, 9, 30)]
    prompts += [[rng.randrange(400) for _ in range(n)] for n in (1, 16, 17, 60, 100)]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)

    def run(**kwargs):
        kwargs.setdefault("max_num_batched_tokens", 128)
        llm = LLM(model=str(path), dtype="float32", device="cuda", attention_backend="triton", block_size=16,
                  kv_cache_dtype="fp8", **kwargs)
        assert llm.engine.executor.runner.kv_caches[0][0].dtype == FP8_DTYPE
        tokens = _tokens(llm.generate(prompts, params, use_tqdm=False))
        tokens += _tokens(llm.generate(prompts[:3], params, use_tqdm=False))  # prefix hits on the cached blocks
        assert llm.engine.kv_cache.all_free()
        return llm, tokens

    eager_llm, eager = run(enforce_eager=True, num_kv_blocks=256)
    assert eager_llm.engine.executor.runner.graphs is None
    del eager_llm
    graph_llm, graphs = run(num_kv_blocks=256)
    replays = graph_llm.engine.executor.runner.graphs.num_replays
    assert replays["decode"] > 0 and replays["tokens"] > 0, replays
    assert graphs == eager
    del graph_llm
    # 9 usable blocks of 16 tokens: the longest request (116 tokens) fits alone, far from all at once
    for options in (dict(num_kv_blocks=10, preemption_mode="swap", swap_space_gib=0.01),
                    dict(num_kv_blocks=10), dict(max_num_batched_tokens=32, num_kv_blocks=256)):
        llm, tokens = run(**options)
        assert tokens == eager, options
        if options["num_kv_blocks"] == 10:
            assert llm.engine.scheduler.num_preemptions > 0
        if "preemption_mode" in options:
            assert llm.engine.scheduler.num_swapped_out > 0
        del llm
