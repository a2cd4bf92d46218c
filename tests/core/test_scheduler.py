"""Scheduler logic against a fake paged runner: the KV it reads back is what the slot mapping wrote."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aioinfer.config import SchedulerConfig
from aioinfer.core.kv_cache_manager import KVCacheManager
from aioinfer.core.scheduler import PLACEHOLDER_TOKEN, RequestTooLongError, Scheduler
from aioinfer.core.scheduler_output import RunnerOutput
from aioinfer.request import Request, RequestStatus
from aioinfer.sampling_params import SamplingParams
from kv_fakes import VOCAB, next_token, reference, request, run_to_end

class PagedEchoRunner:
    """Writes each token into its KV slot and samples from the context read back through the block table."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.slots: list = [None] * (num_blocks * block_size)

    last_sampled: dict = {}

    def execute(self, out) -> RunnerOutput:
        ids, tokens = [], []
        for item in out.scheduled:
            for i, token in enumerate(item.token_ids):
                if token == PLACEHOLDER_TOKEN:  # async scheduling: the token the previous step sampled
                    token = self.last_sampled[item.request_id]
                pos = item.start_position + i
                slot = item.block_ids[pos // self.block_size] * self.block_size + pos % self.block_size
                self.slots[slot] = token
            if item.samples:
                end = item.start_position + len(item.token_ids)
                context = [self.slots[item.block_ids[p // self.block_size] * self.block_size + p % self.block_size]
                           for p in range(end)]
                ids.append(item.request_id)
                tokens.append(next_token(context))
        self.last_sampled = dict(zip(ids, tokens))
        return RunnerOutput(sampled_request_ids=ids, sampled_token_ids=tokens)


def make(num_blocks=64, block_size=4, max_num_seqs=8, budget=32, max_model_len=256):
    kv = KVCacheManager(num_blocks, block_size)
    sched = Scheduler(SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget), kv, max_model_len)
    return sched, PagedEchoRunner(num_blocks, block_size)


def test_batch_matches_reference_with_chunked_prefill_and_mixed_steps():
    sched, runner = make(budget=16)
    rng = random.Random(0)
    prompts = {f"r{i}": [rng.randrange(VOCAB) for _ in range(rng.randint(1, 40))] for i in range(10)}
    for rid, prompt in prompts.items():
        sched.add_request(request(rid, prompt, max_tokens=rng.randint(1, 12)))
    outputs, finish, steps = run_to_end(sched, runner)
    for rid, prompt in prompts.items():
        assert outputs[rid] == reference(prompt, len(outputs[rid]))
        assert finish[rid] == "length"
    # chunked prefill happened (a grant that did not sample) and decodes shared steps with prefills
    assert any(not item.samples for s in steps for item in s.scheduled)
    assert any(len({item.samples for item in s.scheduled}) == 2 for s in steps)
    assert sched.kv_cache.all_free()


def test_preemption_recomputes_identically_and_frees_everything():
    sched, runner = make(num_blocks=12, block_size=4, budget=64, max_num_seqs=8)
    rng = random.Random(1)
    prompts = {f"r{i}": [rng.randrange(VOCAB) for _ in range(rng.randint(5, 12))] for i in range(6)}
    for rid, prompt in prompts.items():
        sched.add_request(request(rid, prompt, max_tokens=20))
    outputs, _, _ = run_to_end(sched, runner)
    assert sched.num_preemptions > 0
    for rid, prompt in prompts.items():
        assert outputs[rid] == reference(prompt, 20)
    assert sched.kv_cache.all_free()


def test_newest_request_is_the_victim():
    sched, runner = make(num_blocks=7, block_size=4, budget=64)  # 6 usable blocks
    sched.add_request(request("old", [1] * 8, max_tokens=8))
    sched.add_request(request("new", [2] * 8, max_tokens=8))
    out = sched.schedule()
    sched.update(out, runner.execute(out))  # each holds 2 blocks + grows
    while sched.num_preemptions == 0:
        out = sched.schedule()
        sched.update(out, runner.execute(out))
    assert sched.requests["new"].status == RequestStatus.PREEMPTED
    assert sched.requests["old"].status == RequestStatus.RUNNING
    run_to_end(sched, runner)


def test_max_num_seqs_and_budget_respected():
    sched, runner = make(max_num_seqs=3, budget=10)
    for i in range(8):
        sched.add_request(request(f"r{i}", [i + 1] * 7, max_tokens=3))
    outputs, _, steps = run_to_end(sched, runner)
    assert max(len(s.scheduled) for s in steps) <= 3
    assert len(outputs) == 8


def test_requests_that_can_never_fit_fail_at_admission():
    sched, _ = make(num_blocks=5, block_size=4, max_model_len=64)  # 16 tokens of cache
    with pytest.raises(RequestTooLongError, match="maximum context length is 64"):
        sched.add_request(request("a", [1] * 60, max_tokens=10))
    with pytest.raises(RequestTooLongError, match="whole cache holds 16 tokens"):
        sched.add_request(request("b", [1] * 10, max_tokens=10))
    with pytest.raises(ValueError, match="at least one token"):
        sched.add_request(request("c", [], max_tokens=1))
    assert not sched.has_unfinished() and sched.kv_cache.all_free()


def test_abort_running_and_waiting_frees_blocks():
    sched, runner = make(max_num_seqs=1)
    sched.add_request(request("run", [1] * 10, max_tokens=50))
    sched.add_request(request("wait", [2] * 10, max_tokens=50))
    out = sched.schedule()
    sched.update(out, runner.execute(out))
    assert sched.requests["run"].status == RequestStatus.RUNNING
    ended = sched.finish_requests(["run", "wait", "unknown"], RequestStatus.FINISHED_ABORTED)
    assert [r.request_id for r in ended] == ["run", "wait"]
    assert sched.finish_requests(["run"], RequestStatus.FINISHED_ABORTED) == []  # twice is harmless
    sched.check_invariants()
    assert sched.kv_cache.all_free()
    assert sched.schedule().finished_request_ids == ["run"]  # the runner is told to drop its state


def test_stop_token_and_eos_and_min_tokens():
    sched, runner = make()
    prompt = [5, 6, 7]
    ref = reference(prompt, 10)
    stop_at = ref[3]
    r = Request(request_id="s", prompt_token_ids=prompt, max_tokens=10, eos_token_ids=(ref[1],),
                sampling_params=SamplingParams(max_tokens=10, stop_token_ids=[stop_at], min_tokens=2))
    sched.add_request(r)
    outputs, finish, _ = run_to_end(sched, runner)
    # EOS at index 1 is ignored because min_tokens=2; the stop token at index 3 ends it
    first_stop = min(i for i, t in enumerate(ref) if t == stop_at or (t == ref[1] and i >= 2))
    assert outputs["s"] == ref[:first_stop + 1]
    assert finish["s"] == "stop"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), num_blocks=st.integers(8, 40), block_size=st.sampled_from([1, 2, 4, 16]),
       budget=st.integers(4, 64), max_num_seqs=st.integers(1, 6), lookahead=st.booleans())
def test_random_arrivals_aborts_and_preemptions_keep_invariants(seed, num_blocks, block_size, budget, max_num_seqs,
                                                                 lookahead):
    """``lookahead`` emulates async scheduling: step N+1 is scheduled and run before step N's update."""
    sched, runner = make(num_blocks=num_blocks, block_size=block_size, budget=budget,
                         max_num_seqs=max_num_seqs, max_model_len=512)
    rng = random.Random(seed)
    prompts, aborted, outputs = {}, set(), {}
    in_flight = None
    capacity = (num_blocks - 1) * block_size
    for step in range(300):
        if rng.random() < 0.3 and len(prompts) < 30:
            rid = f"r{len(prompts)}"
            prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 30))]
            max_tokens = rng.randint(1, 15)
            if len(prompt) + max_tokens > capacity:
                with pytest.raises(RequestTooLongError):
                    sched.add_request(request(rid, prompt, max_tokens))
                continue
            prompts[rid] = (prompt, max_tokens)
            sched.add_request(request(rid, prompt, max_tokens))
        if rng.random() < 0.05 and sched.requests:
            victim = rng.choice(sorted(sched.requests))
            sched.finish_requests([victim], RequestStatus.FINISHED_ABORTED)
            aborted.add(victim)
        if lookahead:
            if in_flight is None:
                out = sched.schedule()
                in_flight = (out, runner.execute(out))
            ahead = sched.schedule()
            ahead_result = (ahead, runner.execute(ahead))
            out, result = in_flight
            in_flight = ahead_result
        else:
            out = sched.schedule()
            result = runner.execute(out)
        for core_out in sched.update(out, result):
            outputs.setdefault(core_out.request_id, []).extend(core_out.new_token_ids)
        sched.check_invariants()
    if in_flight is not None:
        for core_out in sched.update(*in_flight):
            outputs.setdefault(core_out.request_id, []).extend(core_out.new_token_ids)
    for rid in list(sched.requests):
        sched.finish_requests([rid], RequestStatus.FINISHED_ABORTED)
        aborted.add(rid)
    sched.check_invariants()
    assert sched.kv_cache.all_free()
    for rid, (prompt, max_tokens) in prompts.items():
        got = outputs.get(rid, [])
        assert got == reference(prompt, len(got))
        if rid not in aborted:
            assert len(got) == max_tokens
