"""The prefix cache's KV-cache events (core/kv_events.py), against the fake paged runner.

A subscriber that applies every event in order holds exactly the cache's keys at every step, under
shared prefixes, salts, preemption and a pool too small to keep anything long; a reset is refused
while blocks are in use. Off, nothing is recorded. (The wire format: tests/engine/test_kv_events.py.)
"""

from __future__ import annotations

import random

from aioinfer.config import SchedulerConfig
from aioinfer.core.kv_cache_manager import KVCacheManager
from aioinfer.core.kv_events import CacheCleared, RemovedBlock, StoredBlock, records
from aioinfer.core.prefix_cache import BLOCK_HASH
from aioinfer.core.scheduler import Scheduler
from kv_fakes import ChainedKVRunner, request

BLOCK = 4


def make(num_blocks: int, kv_events: bool = True):
    kv = KVCacheManager(num_blocks, BLOCK, enable_prefix_caching=True, model_identity="m", kv_events=kv_events)
    sched = Scheduler(SchedulerConfig(max_num_seqs=6, max_num_batched_tokens=32), kv, 512)
    return sched, kv, ChainedKVRunner(num_blocks, BLOCK)


def live_keys(kv: KVCacheManager) -> dict[int, tuple]:
    entries = (kv.prefix_cache.entry(b) for b in range(kv.pool.num_blocks))
    return {e[BLOCK_HASH]: e for e in entries if e is not None}


def apply(mirror: dict, events) -> None:
    for event in events:
        if isinstance(event, StoredBlock):
            assert event.block_hash not in mirror, "stored twice without a removal"
            assert event.parent_hash is None or event.cache_salt is None
            mirror[event.block_hash] = event
        elif isinstance(event, RemovedBlock):
            del mirror[event.block_hash]  # KeyError: removed without being stored
        else:
            assert isinstance(event, CacheCleared)
            mirror.clear()


def test_a_subscriber_s_view_is_the_cache_s_at_every_step():
    rng = random.Random(7)
    sched, kv, runner = make(num_blocks=20)
    prefixes = [[rng.randrange(1000) for _ in range(12)] for _ in range(3)]
    mirror: dict[int, StoredBlock] = {}
    removed = 0
    for i in range(60):
        prompt = rng.choice(prefixes)[:rng.randrange(0, 13)] + [rng.randrange(1000) for _ in range(rng.randrange(1, 20))]
        r = request(str(i), prompt, rng.randrange(1, 12))
        r.cache_salt = rng.choice([None, None, "tenant"])
        sched.add_request(r)
        for _ in range(rng.randrange(1, 4)):
            if sched.has_unfinished():
                out = sched.schedule()
                sched.update(out, runner.execute(out))
            events = records(kv.events.take())
            removed += sum(isinstance(e, RemovedBlock) for e in events)
            apply(mirror, events)
            live = live_keys(kv)
            assert set(mirror) == set(live)
            for key, entry in live.items():
                event = mirror[key]
                parent = entry[3]
                assert event.token_ids == entry[2]
                assert event.parent_hash == (None if parent is None else parent[BLOCK_HASH])
                assert event.cache_salt == (entry[4][1] if parent is None else None)
    assert removed > 0 and sched.num_preemptions > 0, "the pool never ran short"


def test_reset_is_refused_while_blocks_are_in_use_and_records_one_clear():
    sched, kv, runner = make(num_blocks=32)
    sched.add_request(request("a", list(range(10)), 20))
    out = sched.schedule()
    sched.update(out, runner.execute(out))
    kv.events.take()
    assert not kv.reset_prefix_cache() and kv.events.take() == [] and len(kv.prefix_cache) == 2
    while sched.has_unfinished():
        out = sched.schedule()
        sched.update(out, runner.execute(out))
    assert len(kv.prefix_cache) > 0
    kv.events.take()
    assert kv.reset_prefix_cache() and len(kv.prefix_cache) == 0
    assert records(kv.events.take()) == [CacheCleared()]
    sched.check_invariants()


def test_off_nothing_is_recorded():
    sched, kv, runner = make(num_blocks=32, kv_events=False)
    assert kv.events is None and kv.prefix_cache.events is None
    sched.add_request(request("a", list(range(10)), 5))
    while sched.has_unfinished():
        out = sched.schedule()
        sched.update(out, runner.execute(out))
    assert len(kv.prefix_cache) > 0 and kv.reset_prefix_cache()
    no_cache = KVCacheManager(8, BLOCK, enable_prefix_caching=False, kv_events=True)
    assert no_cache.events is None and no_cache.reset_prefix_cache()
