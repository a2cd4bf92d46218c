"""Prefix caching in the scheduler and KV cache manager, against the fake paged runner.

The fake runner's KV depends on the whole prefix (kv_fakes.py), so a cache hit that pointed at
another prefix's KV fails loudly; every test also compares the tokens with the reference.
"""

from __future__ import annotations

import gc
import random

import pytest

from aioinfer.config import SchedulerConfig
from aioinfer.core import kv_cache_manager
from aioinfer.core.kv_cache_manager import KVCacheManager
from aioinfer.core.scheduler import Scheduler
from aioinfer.request import Request, RequestStatus
from kv_fakes import ChainedKVRunner, VOCAB, reference, request, run_to_end


def make(num_blocks=64, block_size=4, budget=64, max_num_seqs=8, prefix_caching=True):
    kv = KVCacheManager(num_blocks, block_size, enable_prefix_caching=prefix_caching, model_identity="fake")
    sched = Scheduler(SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget), kv, 512)
    return sched, ChainedKVRunner(num_blocks, block_size)


def salted(rid: str, prompt: list[int], max_tokens: int, salt) -> Request:
    r = request(rid, prompt, max_tokens)
    r.cache_salt = salt
    return r


def run_one(sched, runner, req: Request):
    """Run one request alone; returns (tokens, its first grant, its block table at the first step)."""
    sched.add_request(req)
    first = sched.schedule()
    item = next(i for i in first.scheduled if i.request_id == req.request_id)
    table = list(item.block_ids)
    outputs = {}
    for core_out in sched.update(first, runner.execute(first)):
        outputs.setdefault(core_out.request_id, []).extend(core_out.new_token_ids)
    rest, _, _ = run_to_end(sched, runner)
    return outputs.get(req.request_id, []) + rest.get(req.request_id, []), item, table, first


def test_hit_skips_the_cached_blocks_and_gives_the_same_tokens():
    sched, runner = make()
    prompt = [random.Random(0).randrange(VOCAB) for _ in range(38)]
    cold, cold_item, cold_table, out = run_one(sched, runner, request("cold", prompt, 10))
    assert cold_item.start_position == 0 and out.num_prefix_cache_hits == 0
    assert out.num_prefix_cache_queries == 38
    warm, warm_item, warm_table, out = run_one(sched, runner, request("warm", prompt, 10))
    assert warm == cold == reference(prompt, 10)
    # 9 full blocks hold the first 36 tokens; the block of the last token is computed again.
    assert warm_item.start_position == 36 and warm_item.token_ids == prompt[36:]
    assert warm_table[:9] == cold_table[:9]
    assert (out.num_prefix_cache_queries, out.num_prefix_cache_hits) == (38, 36)
    assert sched.kv_cache.all_free()


def test_whole_prompt_hit_still_computes_the_last_block():
    sched, runner = make()
    prompt = list(range(1, 33))  # exactly 8 blocks of 4
    run_one(sched, runner, request("a", prompt, 3))
    tokens, item, _, _ = run_one(sched, runner, request("b", prompt, 3))
    assert tokens == reference(prompt, 3)
    # Sharing the 8th block would mean writing into a shared block: only 7 are reused.
    assert item.start_position == 28 and len(item.token_ids) == 4 and item.samples


def test_num_cached_tokens_is_reported_per_request():
    sched, runner = make()
    prompt = list(range(100, 130))
    sched.add_request(request("a", prompt, 2))
    first_news = {}
    for step in range(20):
        if not sched.has_unfinished():
            break
        out = sched.schedule()
        for o in sched.update(out, runner.execute(out)):
            first_news.setdefault(o.request_id, o.num_cached_tokens)
        if step == 0:
            sched.add_request(request("b", prompt + [7, 8, 9], 2))  # arrives once a's blocks are cached
    assert first_news == {"a": 0, "b": 28}


def test_concurrent_requests_share_blocks_by_reference():
    sched, runner = make(budget=256)
    prefix = list(range(200, 240))  # 10 blocks
    sched.add_request(request("a", prefix + [1, 2, 3], 30))
    out = sched.schedule()
    sched.update(out, runner.execute(out))
    sched.add_request(request("b", prefix + [4, 5], 30))
    out = sched.schedule()
    sched.update(out, runner.execute(out))
    table_a, table_b = sched.kv_cache.block_ids("a"), sched.kv_cache.block_ids("b")
    assert table_a[:10] == table_b[:10] and set(table_a[10:]).isdisjoint(table_b[10:])
    assert all(sched.kv_cache.pool.ref_counts[b] == 2 for b in table_a[:10])
    sched.check_invariants()
    # Aborting one drops one reference; the other keeps running on the shared blocks.
    sched.finish_requests(["a"], RequestStatus.FINISHED_ABORTED)
    assert all(sched.kv_cache.pool.ref_counts[b] == 1 for b in table_b[:10])
    outputs, _, _ = run_to_end(sched, runner)
    assert outputs["b"][-29:] == reference(prefix + [4, 5], 30)[-29:]
    assert sched.kv_cache.all_free()


def test_generated_tokens_are_cached_for_the_next_turn():
    sched, runner = make()
    prompt = list(range(300, 310))
    first, _, _, _ = run_one(sched, runner, request("turn1", prompt, 20))
    follow_up = prompt + first + [5, 6, 7]  # the conversation so far plus a new message
    second, item, _, _ = run_one(sched, runner, request("turn2", follow_up, 5))
    assert second == reference(follow_up, 5)
    # turn1 computed 29 tokens (the 20th output token never went through the model): 7 full blocks.
    assert item.start_position == 28


def test_cache_salt_keeps_tenants_apart():
    sched, runner = make()
    prompt = list(range(400, 440))
    run_one(sched, runner, salted("a1", prompt, 4, "tenant-a"))
    results = {}
    for rid, salt in (("b1", "tenant-b"), ("none", None), ("a2", "tenant-a"), ("b2", "tenant-b")):
        tokens, item, table, _ = run_one(sched, runner, salted(rid, prompt, 4, salt))
        assert tokens == reference(prompt, 4)
        results[rid] = item.start_position
    assert results == {"b1": 0, "none": 0, "a2": 36, "b2": 36}


def test_lru_eviction_takes_the_tail_of_a_finished_sequence_first():
    sched, runner = make(num_blocks=12, block_size=4)  # 11 usable blocks
    prompt = list(range(500, 532))  # 8 blocks
    run_one(sched, runner, request("a", prompt, 1))
    # The 3 never-used blocks go first, then a's blocks from its tail: blocks 8 and 7 of a.
    run_one(sched, runner, request("other", list(range(600, 620)), 1))
    tokens, item, _, _ = run_one(sched, runner, request("again", prompt, 1))
    assert item.start_position == 24  # blocks 1-6 survived
    assert tokens == reference(prompt, 1)


@pytest.mark.parametrize("colliding_hash", [
    lambda parent, tokens, extra: 42,  # every key equal
    lambda parent, tokens, extra: hash(tokens),  # equal blocks after different prefixes collide
], ids=["constant", "ignores-prefix"])
def test_hash_collisions_never_share_wrong_kv(monkeypatch, colliding_hash):
    """Only the token, parent and salt checks stand between a request and another prefix's KV."""
    monkeypatch.setattr(kv_cache_manager, "chain_hash", colliding_hash)
    sched, runner = make(num_blocks=60, block_size=2, budget=24)
    rng = random.Random(5)
    pieces = [[rng.randrange(VOCAB) for _ in range(2)] for _ in range(3)]  # few distinct blocks, reordered
    prompts, salts, outputs, hits = {}, {}, {}, 0
    for i in range(40):
        prompt = [t for _ in range(rng.randint(1, 5)) for t in rng.choice(pieces)] + [rng.randrange(VOCAB)]
        prompts[f"r{i}"], salts[f"r{i}"] = prompt, rng.choice([None, "s"])
        sched.add_request(salted(f"r{i}", prompt, rng.randint(1, 6), salts[f"r{i}"]))
    while sched.has_unfinished():
        out = sched.schedule()
        result = runner.execute(out)
        for item in out.scheduled:  # blocks before the grant: its own KV, or a hit of the same tenant's
            for block in item.block_ids[:item.start_position // 2]:
                assert salts[runner.writer[block]] == salts[item.request_id], "a block crossed tenants"
        for o in sched.update(out, result):
            outputs.setdefault(o.request_id, []).extend(o.new_token_ids)
        sched.check_invariants()
        hits += out.num_prefix_cache_hits
    for rid, prompt in prompts.items():
        assert outputs[rid] == reference(prompt, len(outputs[rid]))
    assert hits > 0
    assert sched.kv_cache.all_free()


def test_prefix_caching_off_shares_nothing():
    sched, runner = make(prefix_caching=False)
    prompt = list(range(700, 740))
    run_one(sched, runner, request("a", prompt, 3))
    tokens, item, _, out = run_one(sched, runner, request("b", prompt, 3))
    assert item.start_position == 0 and out.num_prefix_cache_hits == 0 and tokens == reference(prompt, 3)
    assert len(sched.kv_cache.prefix_cache or ()) == 0


@pytest.mark.parametrize("block_size", [1, 3, 16])
def test_many_requests_with_shared_prefixes_match_the_reference(block_size):
    sched, runner = make(num_blocks=80, block_size=block_size, budget=40, max_num_seqs=6)
    rng = random.Random(block_size)
    system = [rng.randrange(VOCAB) for _ in range(37)]
    prompts = {f"r{i}": system[:rng.randint(20, 37)] + [rng.randrange(VOCAB) for _ in range(rng.randint(1, 9))]
               for i in range(16)}
    for rid, prompt in prompts.items():
        sched.add_request(request(rid, prompt, rng.randint(1, 10)))
    outputs, _, steps = run_to_end(sched, runner)
    for rid, prompt in prompts.items():
        assert outputs[rid] == reference(prompt, len(outputs[rid]))
    assert sum(s.num_prefix_cache_hits for s in steps) > 0
    assert sched.kv_cache.all_free()


def test_cache_entries_leave_the_garbage_collector_once_seen():
    # A cache keeps an entry for every block it has seen until the block is handed out again (600k+
    # on an H200 for the 0.5b model), and every full collection traversed each one it tracked. The
    # entries a real run registers (salted and not) are plain tuples the collector stops tracking: a
    # tuple once its items are untracked, so a chain may take a pass per link, depending on the order
    # the collector meets them in.
    sched, runner = make(num_blocks=64, block_size=4)
    for rid, salt in (("a", None), ("b", "tenant")):
        tokens, _, _, _ = run_one(sched, runner, salted(rid, list(range(1, 14)), 6, salt))
        assert tokens == reference(list(range(1, 14)), 6)
    cache = sched.kv_cache.prefix_cache
    entries = [cache.entry(block_id) for block_id in range(64) if cache.is_cached(block_id)]
    assert len(entries) >= 8  # both requests' full blocks, prompt and output
    for _ in range(len(entries) + 1):
        gc.collect()
    assert not any(gc.is_tracked(entry) for entry in entries)
    sched.kv_cache.check_invariants()
    # A hit still finds them (by identity of the parent chain), after the collection.
    again, item, _, _ = run_one(sched, runner, salted("c", list(range(1, 14)), 6, "tenant"))
    assert again == reference(list(range(1, 14)), 6)
    assert item.start_position == 12  # three of its prompt's blocks from the cache
