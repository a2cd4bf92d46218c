"""Property test: random arrivals, aborts, priorities, shared prefixes, salts and preemptions (both
modes, synchronous and look-ahead scheduling; for memory and for a better-priority arrival) keep the
KV bookkeeping consistent after every step and end with every block free, every reservation zero
and every host run returned."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aioinfer.config import SchedulerConfig
from aioinfer.core.kv_cache_manager import KVCacheManager, cdiv
from aioinfer.core.request_queue import outranks
from aioinfer.core.scheduler import RequestTooLongError, Scheduler
from aioinfer.request import RequestStatus
from kv_fakes import ChainedKVRunner, VOCAB, reference, request

ARRIVAL_STEPS = 200
DRAIN_STEPS = 4000


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), num_blocks=st.integers(8, 48), block_size=st.sampled_from([1, 2, 4, 8]),
       budget=st.integers(4, 64), max_num_seqs=st.integers(1, 6), mode=st.sampled_from(["recompute", "swap"]),
       host_blocks=st.integers(0, 40), prefix_caching=st.booleans(), lookahead=st.booleans(),
       aging_steps=st.sampled_from([1, 7, 100, 10**6]))
def test_kv_bookkeeping_survives_random_traffic(seed, num_blocks, block_size, budget, max_num_seqs, mode,
                                                host_blocks, prefix_caching, lookahead, aging_steps):
    kv = KVCacheManager(num_blocks, block_size, enable_prefix_caching=prefix_caching, model_identity="m")
    config = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, preemption_mode=mode)
    sched = Scheduler(config, kv, 512, num_host_blocks=host_blocks, priority_aging_steps=aging_steps)
    runner = ChainedKVRunner(num_blocks, block_size, host_blocks)
    rng = random.Random(seed)
    capacity = (num_blocks - 1) * block_size
    shared = [[rng.randrange(VOCAB) for _ in range(rng.randint(4, 24))] for _ in range(3)]
    prompts, salts, outputs, aborted = {}, {}, {}, set()
    in_flight = None

    def schedule():
        head = sched.waiting.peek() if sched.waiting else None
        running, before = list(sched.running), sched.num_priority_preemptions
        out = sched.schedule()
        # Priority preemptions come first, from the back of the order, and only of requests the head
        # outranks (never its equals), which is then admitted (unless preempted again for memory).
        victims = running[len(running) - (sched.num_priority_preemptions - before):]
        assert all(outranks(head, victim) for victim in victims)
        assert not victims or head.status == RequestStatus.RUNNING or head.num_preemptions
        for swap in out.swap_out:  # only requests whose prompt is computed are swapped, whole tables
            victim = sched.requests[swap.request_id]
            assert victim.status == RequestStatus.SWAPPED
            assert victim.num_computed_tokens >= victim.num_prompt_tokens
            assert len(swap.device_block_ids) == cdiv(victim.num_computed_tokens, block_size)
        return out

    def execute(out):
        result = runner.execute(out)
        for item in out.scheduled:  # blocks before a grant: its own KV or a same-tenant prefix hit
            for block in item.block_ids[:item.start_position // block_size]:
                assert salts[runner.writer[block]] == salts[item.request_id], "a block crossed tenants"
        return out, result

    def update(out, result):
        for core_out in sched.update(out, result):
            outputs.setdefault(core_out.request_id, []).extend(core_out.new_token_ids)

    for step in range(ARRIVAL_STEPS + DRAIN_STEPS):
        arriving = step < ARRIVAL_STEPS
        if arriving and rng.random() < 0.35:
            rid = f"r{len(prompts)}"
            prefix = rng.choice(shared)[:rng.randint(0, 24)] if rng.random() < 0.7 else []
            prompt = prefix + [rng.randrange(VOCAB) for _ in range(rng.randint(1, 10))]
            max_tokens = rng.randint(1, 15)
            req = request(rid, prompt, max_tokens)
            req.priority = rng.choice([-1, 0, 0, 1, 2])
            req.cache_salt = rng.choice([None, None, "t1", "t2"])
            if len(prompt) + max_tokens > capacity:
                with pytest.raises(RequestTooLongError):
                    sched.add_request(req)
            else:
                prompts[rid], salts[rid] = (prompt, max_tokens), req.cache_salt
                sched.add_request(req)
        if arriving and rng.random() < 0.06 and sched.requests:
            victim = rng.choice(sorted(sched.requests))  # waiting, swapped or running
            sched.finish_requests([victim], RequestStatus.FINISHED_ABORTED)
            aborted.add(victim)
        if not arriving and not sched.has_unfinished() and in_flight is None:
            break
        if lookahead:  # step N+1 is scheduled and launched before step N's results are known
            if in_flight is None:
                in_flight = execute(schedule())
            ahead = execute(schedule())
            update(*in_flight)
            in_flight = ahead
        else:
            update(*execute(schedule()))
        sched.check_invariants()
    if in_flight is not None:
        update(*in_flight)
    sched.check_invariants()
    assert not sched.has_unfinished(), "requests never finished (a scheduling deadlock)"
    assert kv.all_free() and kv.num_reserved_blocks == 0 and sched.host_pool.all_free()
    assert runner.num_swapped_in <= runner.num_swapped_out == sched.num_swapped_out
    for rid, (prompt, max_tokens) in prompts.items():
        got = outputs.get(rid, [])
        assert got == reference(prompt, len(got))
        if rid not in aborted:
            assert len(got) == max_tokens
