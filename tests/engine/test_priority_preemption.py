"""A waiting request of strictly better priority preempts running ones it outranks when it does not
fit (vLLM's priority policy): as few as make room, lowest priority and latest arrival first, never
its equals or betters, never when even all of them would not make room. Against the chained-KV fake
(synchronous and one step ahead), then on the real path against transformers."""

from __future__ import annotations

import pytest
import torch

from aioinfer import LLM, SamplingParams
from aioinfer.request import RequestStatus
from kv_fakes import make, prioritized, reference
from tiny_models import make_tiny_model_dir


class Driver:
    """Steps a scheduler against the fake runner, either synchronously or with step N+1 scheduled
    and executed before step N's results are applied (how the engine runs async scheduling)."""

    def __init__(self, sched, runner, lookahead=False):
        self.sched, self.runner, self.lookahead = sched, runner, lookahead
        self.outputs: dict[str, list[int]] = {}
        self.finished: list[str] = []  # in finishing order
        self.in_flight = None

    def _launch(self):
        out = self.sched.schedule()
        return out, self.runner.execute(out)

    def _update(self, out, result):
        for o in self.sched.update(out, result):
            self.outputs.setdefault(o.request_id, []).extend(o.new_token_ids)
            if o.finish_reason:
                self.finished.append(o.request_id)

    def step(self):
        """One step; returns the SchedulerOutput scheduled by this call."""
        if not self.lookahead:
            launched = self._launch()
            self._update(*launched)
        else:
            if self.in_flight is None:
                self.in_flight = self._launch()
            launched = self._launch()
            self._update(*self.in_flight)
            self.in_flight = launched
        self.sched.check_invariants()  # includes kv_cache_manager.check_invariants()
        return launched[0]

    def run_to_end(self, max_steps=500):
        for _ in range(max_steps):
            if not self.sched.has_unfinished() and self.in_flight is None:
                break
            self.step()
            if not self.sched.has_unfinished() and self.in_flight is not None:
                self._update(*self.in_flight)
                self.in_flight = None
        assert not self.sched.has_unfinished()
        self.sched.check_invariants()
        assert self.sched.kv_cache.all_free() and self.sched.kv_cache.num_reserved_blocks == 0
        assert self.sched.host_pool.all_free()


LOW = list(range(100, 112))  # 3 blocks of 4
HIGH = list(range(200, 214))  # 4 blocks of 4


def _low_running(mode, lookahead, aging_steps=1000):
    # 8 usable blocks; "low" holds 5 after 6 steps (17 tokens computed) and grows to 7 at most.
    sched, runner = make(num_blocks=9, block_size=4, budget=64, mode=mode, host_blocks=16 if mode == "swap" else 0,
                         aging_steps=aging_steps)
    driver = Driver(sched, runner, lookahead)
    sched.add_request(prioritized("low", LOW, 16, priority=1))
    for _ in range(6):
        driver.step()
    assert len(sched.kv_cache.block_ids("low")) == 5
    return sched, driver


@pytest.mark.parametrize("lookahead", [False, True], ids=["sync", "lookahead"])
@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_higher_priority_arrival_preempts_runs_first_and_the_victim_resumes(mode, lookahead):
    sched, driver = _low_running(mode, lookahead)
    sched.add_request(prioritized("high", HIGH, 4, priority=0))  # 4 blocks; 3 free
    out = driver.step()
    assert out.num_preempted == 1 and sched.num_priority_preemptions == 1
    assert [s.request_id for s in out.scheduled] == ["high"]  # admitted in the very step
    low = sched.requests["low"]
    if mode == "swap":  # decoding, so swapped, keeping its computed tokens
        assert [s.request_id for s in out.swap_out] == ["low"] and low.status == RequestStatus.SWAPPED
    else:
        assert out.swap_out == [] and low.status == RequestStatus.PREEMPTED and low.num_computed_tokens == 0
    driver.run_to_end()
    assert driver.finished == ["high", "low"]
    assert driver.outputs["high"] == reference(HIGH, 4) and driver.outputs["low"] == reference(LOW, 16)
    assert sched.num_preemptions == 1 and sched.num_swapped_out == (mode == "swap")


@pytest.mark.parametrize("lookahead", [False, True], ids=["sync", "lookahead"])
@pytest.mark.parametrize("priority", [1, 2])
def test_an_equal_or_worse_arrival_waits(priority, lookahead):
    sched, driver = _low_running("recompute", lookahead)
    sched.add_request(prioritized("other", HIGH, 4, priority=priority))
    driver.run_to_end()
    assert sched.num_preemptions == 0 and driver.finished == ["low", "other"]
    assert driver.outputs["other"] == reference(HIGH, 4) and driver.outputs["low"] == reference(LOW, 16)


def test_aging_protects_an_old_request_from_a_later_better_arrival():
    # One level per 3 steps: "low" (priority 1, step 0) ranks as priority 0 arriving at step 3,
    # ahead of "high" (priority 0) arriving at step 6.
    sched, driver = _low_running("recompute", False, aging_steps=3)
    sched.add_request(prioritized("high", HIGH, 4, priority=0))
    driver.run_to_end()
    assert sched.num_preemptions == 0 and driver.finished == ["low", "high"]


@pytest.mark.parametrize("a_priority, high_len, victims", [
    (2, 16, ["c"]),  # one block short: the last in order (priority 3, latest arrival) suffices
    (2, 28, ["b", "c"]),  # four short: both priority-3 requests
    (2, 40, ["a", "b", "c"]),
    (1, 40, []),  # "a" is its equal: b and c alone would not make room, so nobody is preempted
])
def test_fewest_victims_from_the_back_and_none_when_not_enough(a_priority, high_len, victims):
    sched, runner = make(num_blocks=13, block_size=4, budget=64)  # 12 usable
    driver = Driver(sched, runner)
    prompts = {rid: [i * 50 + t for t in range(11)] for i, rid in enumerate("abc")}  # 3 blocks each
    for rid, priority in (("a", a_priority), ("b", 3), ("c", 3)):
        sched.add_request(prioritized(rid, prompts[rid], 20, priority))
    driver.step()
    high = list(range(300, 300 + high_len))
    sched.add_request(prioritized("high", high, 2, priority=1))  # 3 blocks free
    out = driver.step()
    running = [r.request_id for r in sched.running]
    assert sorted(set("abc") - set(running)) == victims
    assert out.num_preempted == sched.num_priority_preemptions == len(victims)
    assert ("high" in running) == bool(victims)
    driver.run_to_end()
    assert driver.outputs["high"] == reference(high, 2)
    assert all(driver.outputs[rid] == reference(p, 20) for rid, p in prompts.items())


def test_a_sequence_slot_is_made_too():
    sched, runner = make(max_num_seqs=2)  # plenty of blocks, two slots
    driver = Driver(sched, runner)
    sched.add_request(prioritized("x", [1, 2, 3], 10, priority=1))
    sched.add_request(prioritized("y", [4, 5, 6], 10, priority=1))
    driver.step()
    sched.add_request(prioritized("high", [7, 8, 9], 3, priority=0))
    driver.step()
    assert sorted(r.request_id for r in sched.running) == ["high", "x"]
    assert sched.num_priority_preemptions == 1
    driver.run_to_end()
    assert driver.finished[0] == "high"


KEEP = list(range(500, 508))  # 2 blocks
SHARED = list(range(600, 616))  # "low"'s prompt: 4 full blocks, cached as they are computed


@pytest.mark.parametrize("prefix, tail, preempts", [
    # Hits on the victim's own blocks need no new blocks, but those blocks stop being free ones:
    # after preempting "low", 7 blocks are free and 4 of them are the hits, so 3 new blocks fit...
    (SHARED, 10, True),  # 26 tokens: 7 blocks, 4 hit, 3 new
    (SHARED, 14, False),  # 30 tokens: 8 blocks, 4 hit, 4 new: even preempting "low" is not enough
    # ...and hits on a block the victim does not hold (here "keep"'s) are not new blocks at all.
    (KEEP, 26, True),  # 34 tokens: 9 blocks, 2 hit, 7 new
])
def test_prefix_hits_in_the_admission_check(prefix, tail, preempts):
    sched, runner = make(num_blocks=11, block_size=4, budget=64)  # 10 usable
    driver = Driver(sched, runner)
    sched.add_request(prioritized("keep", KEEP, 5, priority=0))  # holds 3 blocks at most
    sched.add_request(prioritized("low", SHARED, 20, priority=2))
    for _ in range(3):
        driver.step()
    assert sched.kv_cache.num_free_blocks == 2  # keep 3 blocks, low 5
    high = prefix + list(range(700, 700 + tail))
    sched.add_request(prioritized("high", high, 40 - len(high), priority=1))
    out = driver.step()
    assert out.num_preempted == sched.num_priority_preemptions == int(preempts)
    assert (sched.requests["high"].status == RequestStatus.RUNNING) == preempts
    driver.run_to_end()
    assert driver.outputs["high"] == reference(high, 40 - len(high))
    assert driver.outputs["low"] == reference(SHARED, 20) and driver.outputs["keep"] == reference(KEEP, 5)


def test_a_victim_mid_prefill_is_unadmitted_not_swapped():
    # 4 tokens a step: "low"'s 24-token prompt (6 blocks reserved) is 8 tokens in when "high" arrives.
    sched, runner = make(num_blocks=9, block_size=4, budget=4, mode="swap", host_blocks=16)
    driver = Driver(sched, runner)
    low = list(range(24))
    sched.add_request(prioritized("low", low, 3, priority=1))
    driver.step()
    driver.step()
    sched.add_request(prioritized("high", list(range(50, 62)), 3, priority=0))  # 3 blocks; 2 unreserved
    out = driver.step()
    assert out.num_preempted == 1 and out.swap_out == []
    assert sched.requests["low"].status == RequestStatus.PREEMPTED
    driver.run_to_end()
    assert sched.num_swapped_out == 0 and driver.finished == ["high", "low"]
    assert driver.outputs["low"] == reference(low, 3)


# ----------------------------------------------------------------------------- real path

BLOCK = 8
LOW_MAX, HIGH_MAX = 24, 10


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def model(request, tmp_path_factory):
    """(model dir, low prompt, high prompt, transformers' greedy continuations)."""
    from transformers import AutoModelForCausalLM

    path = make_tiny_model_dir(tmp_path_factory.mktemp(f"prio-{request.param}"), arch=request.param)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    low = [(7 * i + 3) % 400 for i in range(20)]
    high = [(11 * i + 5) % 400 for i in range(40)]
    expected = []
    with torch.no_grad():
        for prompt, n in ((low, LOW_MAX), (high, HIGH_MAX)):
            out = hf.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False,
                              attention_mask=torch.ones(1, len(prompt), dtype=torch.long))
            expected.append(out[0, len(prompt):].tolist())
    return path, low, high, expected


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("mode", ["recompute", "swap"])
@pytest.mark.parametrize("high_priority", [0, 1], ids=["better", "equal"])
def test_greedy_tokens_match_transformers_through_priority_preemption(model, mode, async_scheduling, high_priority):
    path, low_prompt, high_prompt, (low_expected, high_expected) = model
    # 7 usable blocks of 8: "low" (20 + 24 tokens) holds 4 after a few steps; "high" (40 tokens) needs 5.
    llm = LLM(model=str(path), dtype="float32", device="cpu", block_size=BLOCK, num_kv_blocks=8,
              max_num_batched_tokens=64, preemption_mode=mode, swap_space_gib=0.01, async_scheduling=async_scheduling)
    core, scheduler = llm.engine, llm.engine.scheduler
    assert core.async_scheduling == async_scheduling
    tokens: dict[str, list[int]] = {"low": [], "high": []}
    finished = []

    def step():
        for o in core.step():
            tokens[o.request_id] += o.new_token_ids
            if o.finish_reason:
                finished.append(o.request_id)
        scheduler.check_invariants()

    greedy = SamplingParams(temperature=0.0, max_tokens=LOW_MAX)
    core.add_request(llm.inputs.make_request("low", low_prompt, greedy, priority=1))
    while len(tokens["low"]) < 6:
        step()
    assert len(core.kv_cache.block_ids("low")) == 4
    core.add_request(llm.inputs.make_request("high", high_prompt, SamplingParams(temperature=0.0, max_tokens=HIGH_MAX),
                                             priority=high_priority))
    while core.has_unfinished():
        step()
    assert tokens == {"low": low_expected, "high": high_expected}
    if high_priority == 0:
        assert scheduler.num_priority_preemptions == scheduler.num_preemptions == 1 and finished == ["high", "low"]
        assert scheduler.num_swapped_out == (mode == "swap")
    else:
        assert scheduler.num_preemptions == 0 and finished == ["low", "high"]
    scheduler.check_invariants()
    assert core.kv_cache.all_free() and scheduler.host_pool.all_free()
