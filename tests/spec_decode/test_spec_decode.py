"""Speculative decoding (n-gram drafts): outputs identical with and without it, greedy and sampled.

Two kinds of drafts drive the engine here. The real n-gram proposer on real models (SmolLM2 and
Qwen2.5-Coder GGUFs, input-grounded prompts whose answers repeat the input) shows the feature end
to end. On the tiny random models the n-gram proposer rarely fires (random weights do not copy
their prompt), so an oracle stands in for it: it proposes the true continuation (from a run without
speculation), cut at a random length and sometimes corrupted, so that every step verifies drafts
that are partly right and partly wrong. Verification, acceptance, the roll-back of computed tokens
and KV, stops inside an accepted run and the scheduler paths are all the engine's own.
"""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from aioinfer import LLM, SamplingParams
from aioinfer.config import SpeculativeConfig
from aioinfer.spec_decode import ngram, payoff, policy
from aioinfer.spec_decode.ngram import NgramIndex
from spec_oracle import install_oracle
from tiny_models import make_tiny_model_dir

SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
MAX_TOKENS = 24


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def tiny(request, tmp_path_factory):
    """(model dir, prompts, greedy outputs without speculation). Two prompts repeat earlier ones
    (prefix-cache hits)."""
    path = make_tiny_model_dir(tmp_path_factory.mktemp(request.param), arch=request.param)
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 400) for _ in range(n)] for n in (5, 17, 33, 40, 64, 3, 70, 21)]
    prompts += [prompts[2], prompts[4]]
    off = _llm(path)
    reference = _greedy(off, prompts)
    return path, prompts, reference


def _llm(path, **kwargs) -> LLM:
    return LLM(model=str(path), dtype="float32", device="cpu", **kwargs)


def _greedy(llm: LLM, prompts, **params) -> list[list[int]]:
    sp = SamplingParams(temperature=0.0, max_tokens=params.pop("max_tokens", MAX_TOKENS), **params)
    return [o.outputs[0].token_ids for o in llm.generate(prompts, sp, use_tqdm=False)]


@pytest.fixture
def oracle(monkeypatch):
    """``oracle(continuations, corrupt=0.3)``: drafts from the true continuation (spec_oracle.py)."""
    return lambda continuations, corrupt=0.3, seed=1: install_oracle(monkeypatch, continuations, corrupt, seed)


@pytest.fixture
def drafts_pay(monkeypatch):
    """The measured payoff (spec_decode/payoff.py) always for drafts: tests that count rounds under
    async scheduling must not depend on this machine's timings."""
    monkeypatch.setattr(payoff.DraftPayoff, "prefers_drafts", lambda self, num_running: True)


def _policy(llm: LLM):
    return llm.engine.scheduler.draft_policy


# ----------------------------------------------------------------------------- configuration

def test_config_as_vllm_spells_it(tiny):
    path, _, _ = tiny
    llm = _llm(path, speculative_config=SPEC)
    config = llm.engine.config.speculative
    assert (config.method, config.num_speculative_tokens, config.prompt_lookup_min, config.prompt_lookup_max) == (
        "ngram", 4, 1, 3)
    assert SpeculativeConfig.from_value('{"num_speculative_tokens": 2}').prompt_lookup_max == 5  # vLLM's default
    assert SpeculativeConfig.from_value({"num_speculative_tokens": 2, "prompt_lookup_max": 4}).prompt_lookup_min == 4


@pytest.mark.parametrize("bad, words", [
    ({"num_speculative_tokens": 0}, "num_speculative_tokens"),
    ({"method": "eagle", "num_speculative_tokens": 2}, "method"),
    ({"num_speculative_tokens": 2, "draft_model": "x"}, "unknown keys"),
    ({"method": "ngram"}, "needs num_speculative_tokens"),
    ({"num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 2}, "prompt_lookup_max"),
    ("not json", "JSON"),
    ([1, 2], "dict"),
])
def test_bad_config_is_a_value_error_naming_the_key(tiny, bad, words):
    path, _, _ = tiny
    with pytest.raises(ValueError, match=words):
        _llm(path, speculative_config=bad)


def test_server_settings_check_the_json_before_loading():
    from aioinfer.server_config import ServerConfig

    config = ServerConfig.from_env({"AIOINFER_SPECULATIVE_CONFIG": '{"method": "ngram", "num_speculative_tokens": 3}'})
    assert config.engine_kwargs["speculative_config"] == {"method": "ngram", "num_speculative_tokens": 3}
    with pytest.raises(ValueError, match="AIOINFER_SPECULATIVE_CONFIG.*unknown keys"):
        ServerConfig.from_env({"AIOINFER_SPECULATIVE_CONFIG": '{"num_speculative_tokens": 3, "k": 1}'})


# ----------------------------------------------------------------------------- the proposer

def _naive_proposal(tokens: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    """The longest suffix n-gram in [min_n, max_n] with an earlier occurrence; its latest one's followers."""
    last = len(tokens) - 1
    for n in range(max_n, min_n - 1, -1):
        if n > last:
            continue
        suffix = tokens[last + 1 - n:]
        for end in range(last - 1, n - 2, -1):
            if tokens[end + 1 - n:end + 1] == suffix:
                return tokens[end + 1:end + 1 + k]
    return []


@settings(max_examples=200, deadline=None)
@given(prompt=st.lists(st.integers(0, 4), min_size=1, max_size=30),
       output=st.lists(st.integers(0, 4), max_size=30),
       bounds=st.tuples(st.integers(1, 4), st.integers(0, 3)), k=st.integers(1, 5),
       calls=st.lists(st.integers(0, 30), max_size=6))
def test_ngram_index_proposes_what_a_full_scan_finds(prompt, output, bounds, k, calls):
    min_n, max_n = bounds[0], bounds[0] + bounds[1]
    index = NgramIndex(prompt, min_n, max_n)
    # Called as the output grows (the index is built incrementally), then at the end.
    for cut in sorted(calls) + [len(output)]:
        cut = min(cut, len(output))
        got = index.propose(output[:cut], k)
        assert got == _naive_proposal(prompt + output[:cut], min_n, max_n, k)


def test_policy_backs_off_and_stands_aside_above_its_batch_size():
    from aioinfer.request import Request

    p = policy.DraftPolicy(SpeculativeConfig(num_speculative_tokens=3, prompt_lookup_min=1, prompt_lookup_max=2,
                                             disable_by_batch_size=2))
    assert p.active(2) and not p.active(3)
    r = Request("r", [1, 2, 3], SamplingParams(temperature=0.0, max_tokens=50), max_tokens=50)
    r.length_limit = 50
    r.output_token_ids = [7]
    r.num_computed_tokens = 3  # its prompt is in (a request still in prefill is not ready to draft)
    assert p.drafts_for(r, budget=100) == []  # no n-gram recurs: wait 1 step
    assert (r.draft_wait, r.draft_backoff) == (1, 1)
    assert not p.wants_known_tokens([r])
    r.draft_wait -= 1  # (the scheduler counts a wait down, one decode grant at a time)
    assert p.wants_known_tokens([r])
    r.output_token_ids = [7, 1, 2, 3, 1, 2]
    assert p.drafts_for(r, budget=100) == [3, 1, 2]  # "1 2" recurs: what followed its last copy
    assert p.drafts_for(r, budget=3) == [3, 1]  # within the token budget (one token is the decode's)
    p.verified(r, 3, 0)  # all rejected: the wait doubles
    assert (r.draft_wait, r.draft_backoff) == (2, 2)
    p.verified(r, 3, 2)
    assert r.draft_backoff == 0 and (p.num_drafts, p.num_draft_tokens, p.num_accepted_tokens) == (2, 6, 2)
    assert p.accepted_per_position == [1, 1, 0]
    r.length_limit = 8  # 6 tokens out, 1 for the decode: 1 draft left before the length limit
    r.draft_wait = 0
    assert p.drafts_for(r, budget=100) == [3]


def test_policy_pauses_when_attempts_stop_paying():
    from aioinfer.request import Request

    p = policy.DraftPolicy(SpeculativeConfig(num_speculative_tokens=3, prompt_lookup_min=1, prompt_lookup_max=1))
    r = Request("r", [5, 6], SamplingParams(temperature=0.0, max_tokens=10_000), max_tokens=10_000)
    r.length_limit = 10_000
    attempts = 0
    while p.active(1):  # every attempt drafts (the output repeats one token) and none is accepted
        r.output_token_ids.append(5)
        assert p.drafts_for(r, budget=100)
        p.verified(r, 3, 0)
        r.draft_wait = 0
        attempts += 1
        assert attempts < 100
    assert p.num_pauses == 1 and attempts >= policy.MIN_EVIDENCE
    for _ in range(policy.PAUSE_STEPS - 1):
        p.begin_step()
        assert not p.active(1) and not p.wants_known_tokens([r])
    p.begin_step()
    assert p.active(1)  # and it tries again
    # Attempts that pay keep it on.
    for _ in range(200):
        r.output_token_ids.append(5)
        p.drafts_for(r, budget=100)
        p.verified(r, 3, 1)
        r.draft_wait = 0
    assert p.active(1) and p.num_pauses == 1


def test_lockstep_only_when_the_ready_drafts_pay_for_the_batch():
    """A step is scheduled with every token known only when the requests ready to draft expect at
    least MIN_GAIN_PER_REQUEST accepted tokens for each other running request; a request in
    prefill or still waiting is not ready; each request's expectation follows its own attempts."""
    from aioinfer.request import Request

    p = policy.DraftPolicy(SpeculativeConfig(num_speculative_tokens=4, prompt_lookup_min=1, prompt_lookup_max=2))

    def running(n: int) -> list:
        out = []
        for i in range(n):
            r = Request(f"r{i}", [1, 2, 3], SamplingParams(temperature=0.0, max_tokens=50), max_tokens=50)
            r.length_limit, r.num_computed_tokens, r.draft_wait = 50, 3, 1
            out.append(r)
        return out

    batch = running(10)
    assert not p.wants_known_tokens(batch)  # everyone waits
    batch[0].draft_wait = 0
    assert not p.wants_known_tokens(batch)  # one ready (prior 1.0 < 0.25 x 9): the overlap wins
    batch[1].draft_wait = batch[2].draft_wait = 0
    assert p.wants_known_tokens(batch)  # three ready: 3.0 >= 2.25
    batch[2].num_computed_tokens = 2  # still in prefill: not ready
    assert not p.wants_known_tokens(batch)
    assert p.wants_known_tokens(batch[:1])  # alone, a ready request drafts whatever it expects
    batch[2].num_computed_tokens = 3
    batch[1].draft_yield = batch[2].draft_yield = 0.0
    assert not p.wants_known_tokens(batch)
    for _ in range(policy.EXPLORE_STEPS):
        p.begin_step()
    assert p.wants_known_tokens(batch) and not p.wants_known_tokens(batch)  # now and then they try anyway
    # When the next step is in lockstep anyway (penalties), drafts cost no overlap: any ready request drafts.
    assert p.wants_known_tokens(batch, lockstep_anyway=True) and p.allow_drafts
    for r in batch:
        r.draft_wait = 1
    assert not p.wants_known_tokens(batch, lockstep_anyway=True) and not p.allow_drafts
    # Attempts that got nothing accepted lower a request's expectation; accepted runs raise it.
    r = batch[0]
    r.output_token_ids = [7, 1, 2]
    assert p.drafts_for(r, budget=100)
    p.verified(r, 3, 0)
    p.verified(r, 3, 0)
    assert r.draft_yield == pytest.approx(0.25)
    p.verified(r, 4, 4)
    assert r.draft_yield == pytest.approx(2.125)
    # The step's draft room: the largest token graph less one decode token per running request.
    assert p.step_draft_room(10) == policy.DEFAULT_MAX_STEP_TOKENS - 10 and p.step_draft_room(300) == 0


def test_drafts_of_one_step_stay_within_its_token_cap(tiny, oracle):
    """With max_cuda_graph_prefill_tokens = 12 and four requests drafting 4 each, a step carries at
    most 12 - 4 = 8 drafts (the verification step stays within the largest token graph); the
    outputs are those without speculation."""
    path, prompts, reference = tiny
    oracle({tuple(p): r for p, r in zip(prompts, reference)}, corrupt=0.0)
    llm = _llm(path, speculative_config=SPEC, max_cuda_graph_prefill_tokens=12)
    core = llm.engine
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    ids = [f"c{i}" for i in range(4)]
    for request_id, prompt in zip(ids, prompts[:4]):
        core.add_request(llm.inputs.make_request(request_id, prompt, params))
    got: dict[str, list[int]] = {i: [] for i in ids}
    most = 0
    while core.has_unfinished():
        scheduled, _, outputs = core.step_with_details()
        running = len(scheduled.scheduled)
        assert scheduled.num_draft_tokens <= max(0, 12 - running)
        most = max(most, scheduled.num_draft_tokens)
        for out in outputs:
            got[out.request_id] += out.new_token_ids
    assert [got[i] for i in ids] == reference[:4]
    assert 4 < most <= 8 and core.kv_cache.all_free()  # several requests drafted in one step, up to the cap


def test_payoff_schedules_for_drafts_where_they_yield_more_tokens_per_second():
    """Measured per batch-size bucket: drafts first (to learn), then the overlap, then whichever
    yields more tokens per second and request, the other kind tried for MIN_STEPS decisions after
    16, 32, 64, 128, 128, ... decisions; up to four running requests, always drafts."""
    pay = payoff.DraftPayoff()
    assert [pay.bucket(n) for n in (5, 6, 7, 8, 11, 12, 16, 23, 24, 31, 32)] == [4, 6, 6, 8, 8, 12, 16, 16, 24, 24, 32]
    decisions = []
    for _ in range(600):
        drafts = pay.prefers_drafts(32)
        decisions.append(drafts)
        # At 32 requests: a step for drafts yields 55 tokens in 3 ms, one ahead 32 tokens in 1.25 ms.
        pay.observe(32, drafts, 55 if drafts else 32, 3e-3 if drafts else 1.25e-3)
    m = payoff.MIN_STEPS
    assert decisions[:m] == [True] * m and decisions[m:2 * m] == [False] * m
    later = decisions[2 * m:]
    starts = [i for i, d in enumerate(later) if d and (i == 0 or not later[i - 1])]
    assert all(later[i:i + m] == [True] * m and not any(later[i + m:i + m + 8]) for i in starts)
    gaps = [b - a - m for a, b in zip(starts, starts[1:])]
    assert starts[0] == 15 and gaps[:5] == [31, 63, 127, 127, 127]
    # At 12 requests drafts win (30 tokens in 1.6 ms against 12 in 1.1 ms); the buckets do not mix.
    twelve = []
    for _ in range(40):
        drafts = pay.prefers_drafts(12)
        twelve.append(drafts)
        pay.observe(12, drafts, 30 if drafts else 12, 1.6e-3 if drafts else 1.1e-3)
    assert sum(twelve) == 40 - 2 * m  # learning the overlap, then one try of it
    assert pay.prefers_drafts(20)  # a bucket not yet measured: drafts first
    assert all(pay.prefers_drafts(n) for n in range(1, payoff.ALWAYS_DRAFT_UP_TO + 1) for _ in range(50))
    rates = pay.rates()
    assert rates[12][0] > rates[12][1] and rates[32][0] < rates[32][1]
    pay.observe(12, True, 30, 5.0)  # an idle engine's interval is not a step: ignored
    assert pay.rates()[12] == rates[12]


def test_drafts_that_never_pay_pause_speculation(tiny, monkeypatch, drafts_pay):
    """Always-wrong drafts: speculation pauses itself (the steps run as without it, async scheduling
    included) instead of verifying drafts in every step; the outputs stay the same."""
    path, prompts, reference = tiny
    monkeypatch.setattr(ngram.NgramIndex, "propose", lambda self, output, k: [401] * k)
    llm = _llm(path, async_scheduling=True, speculative_config=SPEC)
    long = SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True)
    want = _llm(path, async_scheduling=True).generate(prompts, long, use_tqdm=False)
    got = llm.generate(prompts, long, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]
    p = _policy(llm)
    print("drafts", p.num_drafts, "pauses", p.num_pauses)
    # (token 401 is a real token: now and then it is the right one)
    assert p.num_drafts > 0 and p.num_accepted_tokens <= 0.02 * p.num_draft_tokens
    # Each request's back-off, the batch's expected gain and the pauses: a few rounds, not one per
    # decode grant.
    assert p.num_drafts < 0.05 * len(prompts) * 200


# ----------------------------------------------------------------------------- equality on every path

PATHS = {
    "default": {},
    "chunked prefill": {"max_num_batched_tokens": 16},
    "preemption by recompute": {"num_kv_blocks": 40, "block_size": 4},
    "preemption by swap": {"num_kv_blocks": 40, "block_size": 4, "preemption_mode": "swap", "swap_space_gib": 0.01},
    "async scheduling": {"async_scheduling": True},
    "async, chunked, preempting": {"async_scheduling": True, "num_kv_blocks": 40, "block_size": 4,
                                   "max_num_batched_tokens": 16},
}


@pytest.mark.parametrize("path_name", list(PATHS))
def test_greedy_outputs_identical_with_drafts(tiny, oracle, path_name):
    path, prompts, reference = tiny
    oracle({tuple(p): r for p, r in zip(prompts, reference)})
    llm = _llm(path, speculative_config=SPEC, **PATHS[path_name])
    outputs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS), use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == reference
    p = _policy(llm)
    # Each request's counts (RequestOutput.metrics) add up to the engine's.
    assert sum(o.metrics["num_accepted_tokens"] for o in outputs) == p.num_accepted_tokens
    assert sum(o.metrics["num_draft_tokens"] for o in outputs) == p.num_draft_tokens
    # Drafts were verified, most accepted, some rejected (the corrupted and the cut ones).
    assert p.num_drafts > 20 and 0 < p.num_accepted_tokens < p.num_draft_tokens
    if "preemption" in path_name:
        assert llm.engine.scheduler.num_preemptions > 0
    if path_name == "preemption by swap":
        assert llm.engine.scheduler.num_swapped_out > 0


def test_greedy_outputs_equal_transformers(tiny, oracle):
    from transformers import AutoModelForCausalLM

    path, prompts, reference = tiny
    oracle({tuple(p): r for p, r in zip(prompts, reference)}, corrupt=0.5)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    got = _greedy(_llm(path, speculative_config=SPEC, max_num_batched_tokens=16), prompts[:4])
    for prompt, tokens in zip(prompts[:4], got):
        with torch.no_grad():
            out = hf.generate(torch.tensor([prompt]), max_new_tokens=MAX_TOKENS, do_sample=False,
                              attention_mask=torch.ones(1, len(prompt), dtype=torch.long))
        assert tokens == out[0, len(prompt):].tolist()


def test_speculation_switches_on_and_off_as_the_batch_shrinks(tiny, oracle, drafts_pay):
    """Above disable_by_batch_size the steps run as without speculation (async scheduling too);
    as requests finish, drafting starts: both modes, and the switches between them, in one run."""
    path, prompts, _ = tiny
    lengths = [4 + 3 * i for i in range(len(prompts))]
    params = [SamplingParams(temperature=0.0, max_tokens=n) for n in lengths]
    off = [o.outputs[0].token_ids for o in _llm(path, async_scheduling=True).generate(prompts, params, use_tqdm=False)]
    oracle({tuple(p): r for p, r in zip(prompts, off)}, corrupt=0.2)
    llm = _llm(path, async_scheduling=True, speculative_config=dict(SPEC, disable_by_batch_size=3))
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert got == off
    assert _policy(llm).num_accepted_tokens > 0


def test_drafting_resumes_after_a_wait_under_async_scheduling(tiny, monkeypatch, drafts_pay):
    """A request that found nothing to draft waits a few steps and tries again, also when the engine
    schedules ahead (every grant then has a token in flight): as many rounds as without async
    scheduling, give or take the step each switch back to lockstep costs."""
    path, prompts, reference = tiny
    truth = {tuple(p): r for p, r in zip(prompts, reference)}

    def sometimes(self, output_token_ids, k):  # no match at a third of the output lengths
        self.tokens += output_token_ids[self._num_output:]
        self._num_output = len(output_token_ids)
        prompt = tuple(self.tokens[:len(self.tokens) - self._num_output])
        if len(output_token_ids) % 3 == 1:
            return []
        return list(truth[prompt][len(output_token_ids):len(output_token_ids) + k])

    monkeypatch.setattr(ngram.NgramIndex, "propose", sometimes)
    rounds = {}
    for async_scheduling in (False, True):
        llm = _llm(path, async_scheduling=async_scheduling, speculative_config=SPEC)
        assert _greedy(llm, prompts) == reference
        rounds[async_scheduling] = _policy(llm).num_drafts
    assert rounds[False] > 2 * len(prompts)
    assert rounds[True] >= 0.7 * rounds[False], rounds


def test_penalised_batches_draft_under_async_scheduling(tiny, oracle):
    """A request with penalties keeps every step in lockstep, so drafts cost no overlap there: the
    batch drafts as often as without async scheduling (the measured payoff is not consulted, and
    no timing decides), with the same outputs."""
    path, prompts, _ = tiny
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, repetition_penalty=1.2)
    want = [o.outputs[0].token_ids for o in _llm(path).generate(prompts, params, use_tqdm=False)]
    oracle({tuple(p): r for p, r in zip(prompts, want)}, corrupt=0.2)
    rounds = {}
    for async_scheduling in (False, True):
        llm = _llm(path, async_scheduling=async_scheduling, speculative_config=SPEC)
        got = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        assert got == want
        rounds[async_scheduling] = _policy(llm).num_drafts
    assert rounds[False] > 2 * len(prompts)
    assert rounds[True] >= 0.7 * rounds[False], rounds


def test_stop_token_and_length_inside_an_accepted_run(tiny):
    path, prompts, reference = tiny
    # Drafts never corrupted nor cut short: each step proposes the next k true tokens, so a stop
    # token or the length limit falls inside an accepted run, and the tokens after it are dropped.
    def propose_all(self, output_token_ids, k):
        self.tokens += output_token_ids[self._num_output:]
        self._num_output = len(output_token_ids)
        prompt = tuple(self.tokens[:len(self.tokens) - self._num_output])
        return list(continuations[prompt][len(output_token_ids):len(output_token_ids) + k])

    continuations = {tuple(p): r for p, r in zip(prompts, reference)}
    index = next(i for i, r in enumerate(reference) if len(set(r[:8])) == 8)
    prompt, expected = prompts[index], reference[index]
    stop = expected[6]
    off = _llm(path).generate([prompt], SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, stop_token_ids=[stop]),
                              use_tqdm=False)[0].outputs[0]
    assert off.token_ids == expected[:7] and off.finish_reason == "stop"

    mp = pytest.MonkeyPatch()
    mp.setattr(ngram.NgramIndex, "propose", propose_all)
    try:
        llm = _llm(path, speculative_config=dict(SPEC, num_speculative_tokens=5))
        on = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, stop_token_ids=[stop]),
                          use_tqdm=False)[0].outputs[0]
        assert (on.token_ids, on.finish_reason) == (off.token_ids, "stop")
        for max_tokens in (1, 2, 5, 9):
            out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=max_tokens), use_tqdm=False)[0]
            assert out.outputs[0].token_ids == expected[:max_tokens]
            assert out.outputs[0].finish_reason == "length"
        assert _policy(llm).num_accepted_tokens > 0
    finally:
        mp.undo()


def test_stop_strings_checked_on_the_committed_text(tiny, oracle):
    path, prompts, reference = tiny
    oracle({tuple(p): r for p, r in zip(prompts, reference)}, corrupt=0.2)
    off_llm = _llm(path)
    texts = [o.outputs[0].text for o in off_llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS),
                                                         use_tqdm=False)]
    # A stop string from the middle of each text (where there is one to take).
    stops = [t[len(t) // 2:len(t) // 2 + 2] if len(t) >= 6 else None for t in texts]
    params = [SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, stop=[s] if s and s.strip() else None)
              for s in stops]
    want = [(o.outputs[0].text, o.outputs[0].finish_reason) for o in off_llm.generate(prompts, params, use_tqdm=False)]
    llm = _llm(path, speculative_config=SPEC)
    got = [(o.outputs[0].text, o.outputs[0].finish_reason) for o in llm.generate(prompts, params, use_tqdm=False)]
    assert got == want
    assert any(reason == "stop" for _, reason in want)


def test_n_choices_and_mixed_batches(tiny, oracle):
    """n > 1 greedy choices draft each on their own; seeded sampled requests, requests with logprobs
    and with penalties draft too and keep their tokens, in the same batches."""
    path, prompts, reference = tiny
    oracle({tuple(p): r for p, r in zip(prompts, reference)})
    params = []
    for i in range(len(prompts)):
        if i % 4 == 0:
            params.append(SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, n=2))
        elif i % 4 == 1:
            params.append(SamplingParams(temperature=0.9, top_p=0.9, seed=i, max_tokens=MAX_TOKENS))
        elif i % 4 == 2:
            params.append(SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, logprobs=2))
        else:
            params.append(SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, repetition_penalty=1.3))

    def run(llm):
        return [[(c.token_ids, c.cumulative_logprob) for c in o.outputs] for o in llm.generate(prompts, params,
                                                                                                use_tqdm=False)]

    off = run(_llm(path))
    llm = _llm(path, speculative_config=SPEC)
    on = run(llm)
    assert [[ids for ids, _ in o] for o in on] == [[ids for ids, _ in o] for o in off]
    # Logprobs from a verification row's logits: the same float32 values up to summation order.
    assert [[lp is None for _, lp in o] for o in on] == [[lp is None for _, lp in o] for o in off]
    assert all(lp_on == pytest.approx(lp_off, abs=1e-4) for a, b in zip(on, off) for (_, lp_on), (_, lp_off) in zip(a, b)
               if lp_on is not None)
    assert _policy(llm).num_accepted_tokens > 0


@pytest.mark.parametrize("knobs", [dict(temperature=1.0), dict(temperature=0.7, top_p=0.8),
                                   dict(temperature=1.2, top_k=5, min_p=0.05), dict(temperature=0.5, logit_bias={7: 3.0}),
                                   dict(temperature=0.9, presence_penalty=0.8, frequency_penalty=0.5),
                                   dict(temperature=0.0, repetition_penalty=1.5)])
def test_seeded_sampling_draws_the_same_tokens_with_drafts(tiny, oracle, knobs):
    """A sampled request's verification rows draw the noise of their own output positions, so with
    drafts it samples exactly the tokens it samples without them (seeded and batch-independent)."""
    path, prompts, reference = tiny
    oracle({tuple(p): r for p, r in zip(prompts, reference)}, corrupt=0.2)  # greedy continuations as drafts
    params = [SamplingParams(max_tokens=MAX_TOKENS, seed=100 + i, **knobs) for i in range(len(prompts))]
    off = [o.outputs[0].token_ids for o in _llm(path).generate(prompts, params, use_tqdm=False)]
    llm = _llm(path, speculative_config=SPEC)
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)] == off
    assert _policy(llm).num_drafts > 0


def test_sampled_distribution_is_unchanged_by_drafts(tiny, oracle, monkeypatch):
    """The distribution itself, from independent draws (different seeds with and without drafts):
    a chi-square two-sample test on the third token after a fixed prompt."""
    from scipy.stats import chi2_contingency

    # Low acceptance at temperature 1 would pause speculation (policy.py): here it must keep drafting.
    monkeypatch.setattr(policy, "MIN_EVIDENCE", float("inf"))
    path, prompts, reference = tiny
    prompt = prompts[1]
    oracle({tuple(prompt): reference[1]}, corrupt=0.0)
    draws = 1500

    def third_tokens(llm, first_seed):
        params = [SamplingParams(temperature=1.0, max_tokens=3, ignore_eos=True, seed=first_seed + i)
                  for i in range(draws)]
        return [o.outputs[0].token_ids[2] for o in llm.generate([prompt] * draws, params, use_tqdm=False)]

    off = third_tokens(_llm(path), 0)
    # Drafts in a batch this large: no batch-size limit, and room for them beside 256 decode tokens.
    llm = _llm(path, speculative_config=dict(SPEC, disable_by_batch_size=draws), max_cuda_graph_prefill_tokens=4096)
    on = third_tokens(llm, 10_000)
    assert _policy(llm).num_accepted_tokens > 0
    tokens = sorted(set(off) | set(on))
    common = [t for t in tokens if off.count(t) + on.count(t) >= 10]  # rare tokens pooled into one cell
    table = [[off.count(t) for t in common] + [sum(off.count(t) for t in tokens if t not in common)],
             [on.count(t) for t in common] + [sum(on.count(t) for t in tokens if t not in common)]]
    table = [row for row in zip(*table) if sum(row)]  # drop an empty pooled cell
    assert len(table) >= 3, "the distribution is too peaked to test"
    _, p_value, _, _ = chi2_contingency(list(zip(*table)))
    assert p_value > 1e-3


def test_logprobs_of_accepted_tokens(tiny, oracle):
    """A request with logprobs drafts; each accepted token's logprobs (the sampled one's and the
    top-N, from that verification row's raw logits) are those of the step that samples it without
    drafts."""
    path, prompts, reference = tiny
    oracle({tuple(p): r for p, r in zip(prompts, reference)}, corrupt=0.2)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, logprobs=3)
    off = _llm(path).generate(prompts, params, use_tqdm=False)
    llm = _llm(path, speculative_config=SPEC)
    on = llm.generate(prompts, params, use_tqdm=False)
    assert _policy(llm).num_accepted_tokens > 0
    for a, b in zip(on, off):
        a, b = a.outputs[0], b.outputs[0]
        assert a.token_ids == b.token_ids and len(a.logprobs) == len(b.logprobs) == len(a.token_ids)
        for la, lb in zip(a.logprobs, b.logprobs):
            assert list(la) == list(lb)  # the same tokens, in rank order
            for token in la:
                assert la[token].rank == lb[token].rank
                assert la[token].logprob == pytest.approx(lb[token].logprob, abs=1e-4)
                assert la[token].decoded_token == lb[token].decoded_token



def test_prompt_logprobs_come_whole_when_the_last_prompt_chunk_drafts(tiny, oracle):
    """A prompt whose last prefill chunk is its last token alone is granted drafts in that step, so its
    first token comes through verification: the prompt's logprobs come with it, every row, as without
    speculation (they were left on the request: one entry for a 33-token prompt, and the output
    processor's check stopped generate)."""
    path, prompts, reference = tiny
    prompt = prompts[2]  # 33 tokens: chunks of 32 and 1
    assert len(prompt) == 33
    oracle({tuple(prompt): reference[2]}, corrupt=0.0)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, prompt_logprobs=2, logprobs=1)
    off = _llm(path, max_num_batched_tokens=32).generate([prompt], params, use_tqdm=False)[0]
    llm = _llm(path, max_num_batched_tokens=32, speculative_config=SPEC)
    on = llm.generate([prompt], params, use_tqdm=False)[0]
    assert _policy(llm).num_accepted_tokens > 0 and on.outputs[0].token_ids == off.outputs[0].token_ids
    assert len(on.prompt_logprobs) == len(off.prompt_logprobs) == 33 and on.prompt_logprobs[0] is None
    for a, b in zip(on.prompt_logprobs[1:], off.prompt_logprobs[1:]):
        assert list(a) == list(b) and [a[t].rank for t in a] == [b[t].rank for t in b]
        assert [a[t].logprob for t in a] == pytest.approx([b[t].logprob for t in b], abs=1e-4)

def test_no_drafts_before_min_tokens(tiny, oracle):
    """min_tokens masks the stop tokens by output position: a request drafts only once it is reached."""
    path, prompts, reference = tiny
    oracle({tuple(p): r for p, r in zip(prompts, reference)}, corrupt=0.0)
    llm = _llm(path, speculative_config=SPEC)
    llm.generate(prompts[:3], SamplingParams(temperature=0.0, max_tokens=8, min_tokens=8), use_tqdm=False)
    assert _policy(llm).num_drafts == 0
    params = SamplingParams(temperature=0.0, max_tokens=16, min_tokens=6)
    on = [o.outputs[0].token_ids for o in llm.generate(prompts[:3], params, use_tqdm=False)]
    assert on == [o.outputs[0].token_ids for o in _llm(path).generate(prompts[:3], params, use_tqdm=False)]
    assert _policy(llm).num_drafts > 0


# ----------------------------------------------------------------------------- invariants under random drafts

@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10_000), k=st.integers(1, 6), block_size=st.sampled_from([2, 4, 16]),
       budget=st.sampled_from([8, 16, 64]), mode=st.sampled_from(["recompute", "swap"]))
def test_scheduler_invariants_hold_under_random_drafts(tiny_qwen2, seed, k, block_size, budget, mode):
    """Random drafts (mostly wrong): after every step the scheduler's bookkeeping holds, and the
    outputs are those without speculation; at the end every block is free."""
    from aioinfer.engine.engine_core import EngineCore

    path, prompts, reference = tiny_qwen2
    rng = random.Random(seed)
    truth = {tuple(p): r for p, r in zip(prompts, reference)}

    def propose(self, output_token_ids, k_max):
        self.tokens += output_token_ids[self._num_output:]
        self._num_output = len(output_token_ids)
        prompt = tuple(self.tokens[:len(self.tokens) - self._num_output])
        true = truth[prompt][len(output_token_ids):len(output_token_ids) + k_max]
        return [t if rng.random() < 0.5 else rng.randrange(3, 400) for t in true][:rng.randint(0, k_max)]

    mp = pytest.MonkeyPatch()
    mp.setattr(ngram.NgramIndex, "propose", propose)
    try:
        llm = _llm(path, speculative_config=dict(SPEC, num_speculative_tokens=k), block_size=block_size,
                   num_kv_blocks=200 // block_size + 2, max_num_batched_tokens=budget, preemption_mode=mode,
                   swap_space_gib=0.01)
        core: EngineCore = llm.engine
        params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
        ids = [f"r{i}" for i in range(len(prompts))]
        for request_id, prompt in zip(ids, prompts):
            core.add_request(llm.inputs.make_request(request_id, prompt, params))
        got: dict[str, list[int]] = {i: [] for i in ids}
        while core.has_unfinished():
            for out in core.step():
                got[out.request_id] += out.new_token_ids
            core.scheduler.check_invariants()
        assert [got[i] for i in ids] == reference
        assert core.kv_cache.all_free()
    finally:
        mp.undo()


@pytest.fixture(scope="module")
def tiny_qwen2(tmp_path_factory):
    path = make_tiny_model_dir(tmp_path_factory.mktemp("qwen2h"), arch="qwen2")
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 400) for _ in range(n)] for n in (5, 17, 33, 40, 3, 21)]
    prompts.append(prompts[2])
    return path, prompts, _greedy(_llm(path), prompts)


# ----------------------------------------------------------------------------- real models, real drafts

TEXT = ("The quick brown fox jumps over the lazy dog. Paged attention stores keys and values in fixed-size "
        "blocks, so that memory is allocated on demand and shared between sequences with a common prefix.")
CODE = "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a * b\n"


def _real_equal_with_drafts(model_path, messages, max_tokens, sampled: bool = False):
    """Greedy replies to every conversation (and, with ``sampled``, a seeded sampled reply to the
    first) without and with drafts: identical. Returns the drafting engine's policy and the replies."""
    runs = [(m, SamplingParams(temperature=0.0, max_tokens=max_tokens)) for m in messages]
    if sampled:
        runs.append((messages[0], SamplingParams(temperature=0.8, top_p=0.95, seed=7, max_tokens=max_tokens)))
    off = LLM(model=str(model_path), dtype="float32", device="cpu", max_model_len=1024)
    want = [off.chat(m, sp, use_tqdm=False)[0].outputs[0] for m, sp in runs]
    del off
    on = LLM(model=str(model_path), dtype="float32", device="cpu", max_model_len=1024, speculative_config=SPEC)
    got = [on.chat(m, sp, use_tqdm=False)[0].outputs[0] for m, sp in runs]
    assert [(g.token_ids, g.text, g.finish_reason) for g in got] == [(w.token_ids, w.text, w.finish_reason)
                                                                      for w in want]
    return _policy(on), want


@pytest.mark.slow
def test_real_ngram_drafts_smollm2(smollm2_gguf):
    messages = [[{"role": "user", "content": f"Repeat the following text exactly, word for word:\n\n{TEXT}"}],
                [{"role": "user", "content": f"Copy this sentence and then add one more sentence:\n\n{TEXT}"}]]
    p, want = _real_equal_with_drafts(smollm2_gguf, messages, 60, sampled=True)
    # The answers copy the input: most drafts are accepted, and EOS came inside the run.
    assert p.num_accepted_tokens > 0.5 * p.num_draft_tokens > 0
    assert want[0].finish_reason == "stop"


@pytest.mark.slow
def test_real_ngram_drafts_qwen25_coder(qwen25_coder_gguf):
    messages = [[{"role": "user", "content": f"Rename the function add to plus in this code:\n\n{CODE}"}]]
    p, _ = _real_equal_with_drafts(qwen25_coder_gguf, messages, 40)
    assert p.num_accepted_tokens > 0


# ----------------------------------------------------------------------------- async Engine and the server

def test_async_engine_streams_the_same_tokens_and_reports_the_counts(tiny, oracle):
    import anyio

    from aioinfer import Engine

    path, prompts, reference = tiny
    oracle({tuple(p): r for p, r in zip(prompts, reference)})

    class Recorder:
        def __init__(self):
            self.drafts = self.draft_tokens = self.accepted = 0
            self.per_position: list[int] = []

        def on_step(self, stats):
            self.drafts += stats.num_spec_drafts
            self.draft_tokens += stats.num_spec_draft_tokens
            self.accepted += stats.num_spec_accepted_tokens
            for position, count in enumerate(stats.spec_accepted_per_position):
                self.per_position += [0] * (position + 1 - len(self.per_position))
                self.per_position[position] += count

        def on_request_done(self, stats):
            pass

        def on_rejected(self, reason):
            pass

    recorder = Recorder()

    async def main():
        async with Engine(str(path), dtype="float32", device="cpu", speculative_config=SPEC,
                          observers=[recorder]) as engine:
            got = [[] for _ in prompts]

            async def one(i):
                async for delta in engine.generate(prompts[i], SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)):
                    got[i] += delta.token_ids

            async with anyio.create_task_group() as tg:
                for i in range(len(prompts)):
                    tg.start_soon(one, i)
            return got

    assert anyio.run(main) == reference
    assert recorder.drafts > 0 and 0 < recorder.accepted < recorder.draft_tokens
    assert sum(recorder.per_position) == recorder.accepted and recorder.per_position[0] >= recorder.per_position[-1]


@pytest.mark.slow
def test_server_with_speculation_gives_the_same_text_and_the_metrics_move(smollm2_gguf):
    from openai import OpenAI

    from server_process import metric, metric_samples, start_server

    messages = [{"role": "user", "content": f"Repeat the following text exactly, word for word:\n\n{TEXT}"}]
    llm = LLM(model=str(smollm2_gguf), dtype="float32", device="cpu", max_model_len=2048)
    want = llm.chat(messages, SamplingParams(temperature=0, max_tokens=48), use_tqdm=False)[0].outputs[0].text
    prompt_want = llm.generate([TEXT + " " + TEXT[:60]], SamplingParams(temperature=0, max_tokens=32),
                               use_tqdm=False)[0].outputs[0].text
    del llm
    server = start_server({"AIOINFER_DEVICE": "cpu", "AIOINFER_DTYPE": "float32", "AIOINFER_MAX_MODEL_LEN": "2048",
                           "AIOINFER_SPECULATIVE_CONFIG": '{"method": "ngram", "num_speculative_tokens": 4, '
                                                          '"prompt_lookup_max": 3, "prompt_lookup_min": 1}'})
    try:
        client = OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
        args = dict(model="SmolLM2-135M-Instruct", messages=messages, max_tokens=48, temperature=0)
        full = client.chat.completions.create(**args).choices[0].message.content
        streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **args)
                           if c.choices)
        assert full == streamed == want
        comp = dict(model="SmolLM2-135M-Instruct", prompt=TEXT + " " + TEXT[:60], max_tokens=32, temperature=0)
        assert client.completions.create(**comp).choices[0].text == prompt_want
        assert "".join(c.choices[0].text for c in client.completions.create(stream=True, **comp)) == prompt_want
        samples = metric_samples(server)
        drafts = metric(samples, "vllm:spec_decode_num_drafts_total")
        draft_tokens = metric(samples, "vllm:spec_decode_num_draft_tokens_total")
        accepted = metric(samples, "vllm:spec_decode_num_accepted_tokens_total")
        assert drafts > 0 and 0 < accepted <= draft_tokens
        assert metric(samples, "vllm:spec_decode_num_accepted_tokens_per_pos_total") == accepted
        assert metric(samples, "vllm:spec_decode_num_accepted_tokens_per_pos_total", position="0") > 0
    finally:
        assert server.stop() == 0, server.output()
        server.close_log()

