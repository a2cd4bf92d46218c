"""Requests join a running engine at any step, as a server's do: each one's tokens, logprobs and prompt
logprobs equal its own alone in the synchronous loop, whatever else runs beside it.

Random plans (fixed seeds): a few requests, each joining at a random step of an async-scheduled engine
core (so usually while a step is launched ahead), with random sampling options (greedy or seeded,
top-k/p, min-p, the three penalties, min_tokens, logit_bias, stop tokens, ignore_eos, logprobs,
prompt logprobs, a grammar), prompts that share prefixes (prefix-cache hits) or repeat themselves
(n-gram drafts), on every scheduler path: chunked prefill, preemption by recompute and by swap, a
small batch, speculation. The reference runs each request alone on the same path in lockstep. The asyncio ``Engine`` gets
the same kind of plans from concurrent tasks, some leaving their stream early: each stream that is
not left carries exactly its tokens alone, and one that is left a prefix of them.

Each defect this found was one a server would hit: a request with penalties joining a step ahead
stopped the step loop; with speculation, the rows after a complete grammar's allowed every token;
min_tokens masked the EOS a complete grammar needs; and prompt logprobs were dropped when the
prompt's last chunk drafted.
"""

from __future__ import annotations

import random

import anyio
import pytest

from aioinfer import LLM, Engine, SamplingParams
from aioinfer.structured_output import StructuredOutputsParams
from tiny_models import make_tiny_model_dir

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
PATHS = {
    "plain": {},
    "chunked prefill": {"max_num_batched_tokens": 24},
    "preemption by recompute": {"block_size": 4, "num_kv_blocks": 40, "max_num_batched_tokens": 48},
    "three at a time": {"max_num_seqs": 3},
    "preemption by swap": {"block_size": 4, "num_kv_blocks": 40, "preemption_mode": "swap", "swap_space_gib": 0.01},
    "speculation": {"speculative_config": NGRAM},
    "speculation, chunked, preempting": {"speculative_config": NGRAM, "block_size": 4, "num_kv_blocks": 40,
                                         "max_num_batched_tokens": 32},
}
GRAMMARS = [StructuredOutputsParams(regex=r"[a-z ]{3,20}"),
            StructuredOutputsParams(choice=["yes", "no", "maybe not"]),
            StructuredOutputsParams(json={"type": "object", "properties": {"a": {"type": "integer"}},
                                          "required": ["a"]})]
SEEDS = range(10)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model_dir(tmp_path_factory.mktemp("joining"), arch="qwen2")


def _params(rng: random.Random) -> SamplingParams:
    kw: dict = {"max_tokens": rng.randint(1, 24)}
    if rng.random() < 0.5:
        kw["temperature"] = 0.0
    else:
        kw.update(temperature=rng.choice([0.5, 1.0]), seed=rng.randint(0, 10**6))
        if rng.random() < 0.3:
            kw["top_p"] = 0.8
        if rng.random() < 0.3:
            kw["top_k"] = 20
        if rng.random() < 0.2:
            kw["min_p"] = 0.05
    if rng.random() < 0.3:
        kw["repetition_penalty"] = rng.choice([0.8, 1.3])
    if rng.random() < 0.3:
        kw["presence_penalty"] = rng.choice([-0.5, 0.7])
    if rng.random() < 0.3:
        kw["frequency_penalty"] = rng.choice([-0.3, 0.4])
    if rng.random() < 0.3:
        kw["min_tokens"] = rng.randint(0, kw["max_tokens"])
    if rng.random() < 0.3:
        kw["logit_bias"] = {rng.randint(0, 400): rng.choice([-5.0, 5.0]) for _ in range(3)}
    if rng.random() < 0.3:
        kw["stop_token_ids"] = [rng.randint(0, 400) for _ in range(3)]
    if rng.random() < 0.3:
        kw["ignore_eos"] = True
    if rng.random() < 0.2:
        kw["logprobs"] = rng.choice([0, 2])
    if rng.random() < 0.15:
        kw["prompt_logprobs"] = rng.choice([0, 1])
    if rng.random() < 0.3:
        kw["structured_outputs"] = rng.choice(GRAMMARS)
    return SamplingParams(**kw)


def _plan(seed: int) -> list[tuple[int, list[int], SamplingParams]]:
    """(the step it joins at, its prompt, its params) per request."""
    rng = random.Random(seed)
    plan: list = []
    for _ in range(rng.randint(3, 10)):
        if plan and rng.random() < 0.3:  # a prefix of an earlier prompt and a tail of its own
            base = rng.choice(plan)[1]
            prompt = base[:rng.randint(1, len(base))] + [rng.randint(3, 399) for _ in range(rng.randint(0, 12))]
        else:
            prompt = [rng.randint(3, 399) for _ in range(rng.randint(1, 40))]
            if rng.random() < 0.3:
                prompt = (prompt[:6] * 6)[:40]  # repeats: the n-gram proposer finds drafts
        plan.append((rng.randint(0, 12), prompt, _params(rng)))
    return plan


def _drive(llm: LLM, plan) -> dict[str, dict]:
    """Each request added to the engine core at its step; what the core gave each: its tokens, its
    logprobs (sampled logprob, rank, top ids) and its prompt logprobs (logprob, position, rank)."""
    core = llm.engine
    got = {str(i): {"tokens": [], "logprobs": [], "prompt": []} for i in range(len(plan))}
    order = sorted(range(len(plan)), key=lambda i: plan[i][0])
    step = added = 0
    while added < len(order) or core.has_unfinished():
        while added < len(order) and plan[order[added]][0] <= step:
            i = order[added]
            core.add_request(llm.inputs.make_request(str(i), plan[i][1], plan[i][2].clone()))
            added += 1
        if core.has_unfinished():
            for out in core.step():
                news = got[out.request_id]
                news["tokens"] += out.new_token_ids
                news["logprobs"] += [(l.sampled_logprob, l.sampled_rank, list(l.top_token_ids))
                                     for l in out.new_logprobs]
                for rows in out.prompt_logprobs or ():
                    news["prompt"] += [(lp, rows.first_position + j, rank) for j, (lp, rank)
                                       in enumerate(zip(rows.token_logprobs, rows.token_ranks))]
        step += 1
    assert core.kv_cache.all_free()
    return got


def _same(got: list, want: list) -> bool:
    """Equal entry by entry: the first element (a logprob) within 1e-4, the rest exactly."""
    return len(got) == len(want) and all(
        g[1:] == w[1:] and g[0] == pytest.approx(w[0], abs=1e-4) for g, w in zip(got, want))


@pytest.mark.parametrize("path_name", list(PATHS))
def test_requests_joining_at_random_steps_get_their_own_outputs(model_dir, path_name):
    options = PATHS[path_name]
    alone = LLM(model=str(model_dir), dtype="float32", device="cpu", async_scheduling=False, **options)
    joined = LLM(model=str(model_dir), dtype="float32", device="cpu", async_scheduling=True, **options)
    for seed in SEEDS:
        plan = _plan(seed)
        got = _drive(joined, plan)
        for i, (_, prompt, params) in enumerate(plan):
            want = _drive(alone, [(0, prompt, params)])["0"]
            mine = got[str(i)]
            where = (seed, i, params)
            assert mine["tokens"] == want["tokens"], where
            assert _same(mine["logprobs"], want["logprobs"]), where
            if params.prompt_logprobs is not None:
                assert len(want["prompt"]) == len(prompt) - 1, where  # the first token has none
                assert _same(mine["prompt"], want["prompt"]), where
    for llm in (alone, joined):
        assert llm.engine.executor.runner.grammar_masks.num_rejected == 0


@pytest.mark.parametrize("path_name", list(PATHS))
def test_engine_streams_each_request_its_own_tokens_while_others_come_and_go(model_dir, path_name):
    options = PATHS[path_name]
    alone = LLM(model=str(model_dir), dtype="float32", device="cpu", async_scheduling=False, **options)
    for seed in range(4):
        rng = random.Random(1000 + seed)
        requests = []  # (delay before it starts, prompt, params, how many deltas before it leaves or None)
        for _ in range(rng.randint(4, 10)):
            params = _params(rng)
            params.prompt_logprobs = None  # the streams compare tokens only
            requests.append((rng.random() * 0.02, [rng.randint(3, 399) for _ in range(rng.randint(1, 40))],
                             params, rng.randint(1, 6) if rng.random() < 0.25 else None))
        want = [alone.generate([prompt], params.clone(), use_tqdm=False)[0].outputs[0].token_ids
                for _, prompt, params, _ in requests]
        got = anyio.run(_stream_all, model_dir, options, requests)
        for i, (_, _, params, leave_after) in enumerate(requests):
            if leave_after is None:
                assert got[i] == want[i], (seed, i, params)
            else:
                assert got[i] == want[i][:len(got[i])], (seed, i, params)


async def _stream_all(model_dir, options, requests) -> dict[int, list[int]]:
    got: dict[int, list[int]] = {}
    async with Engine(str(model_dir), dtype="float32", device="cpu", async_scheduling=True, **options) as engine:

        async def one(i, delay, prompt, params, leave_after):
            await anyio.sleep(delay)
            if params.structured_outputs is not None:
                await engine.prepare_structured_output(params.structured_outputs)
            got[i] = []
            deltas = 0
            async for delta in engine.generate(prompt, params):
                got[i] += delta.token_ids
                deltas += 1
                if leave_after is not None and deltas >= leave_after:
                    break

        async with anyio.create_task_group() as tasks:
            for i, request in enumerate(requests):
                tasks.start_soon(one, i, *request)
    return got
