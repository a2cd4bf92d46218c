"""Prefix-affinity routing for the Ray Serve deployment, without a cluster: route keys and
rendezvous orders equal across processes, rendezvous moving only the keys of a replica that comes
or goes, and PrefixAffinityRouter's choices, read directly and through Ray's own routing loop over
fake replicas (ids, capacities and queue lengths, no actors)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

request_router = pytest.importorskip("ray.serve.request_router")

from ray.serve._private.common import DeploymentHandleSource, DeploymentID, RequestMetadata  # noqa: E402

from aioinfer.ray.routing import PrefixAffinityRouter, prefix_route_key, rendezvous_order  # noqa: E402

ReplicaID = request_router.ReplicaID
PendingRequest = request_router.PendingRequest
DEPLOYMENT = DeploymentID(name="engine", app_name="aioinfer")
REPO = Path(__file__).resolve().parents[2]
BS = 4  # block size of the keys below


class FakeReplica:
    """What the router and Ray's routing loop read of a RunningReplica."""

    def __init__(self, unique_id: str, max_ongoing_requests: int = 16, queue_len: int = 0,
                 probe_yields: int = 0) -> None:
        self.replica_id = ReplicaID(unique_id=unique_id, deployment_id=DEPLOYMENT)
        self.max_ongoing_requests = max_ongoing_requests
        self.queue_len = queue_len  # what a probe answers
        self.probe_yields = probe_yields  # event-loop turns a probe takes (a latency without a clock)

    async def get_queue_len(self, *, deadline_s: float) -> int:
        for _ in range(self.probe_yields):
            await asyncio.sleep(0)
        return self.queue_len


def make_router(*, cache: bool = True, **state) -> PrefixAffinityRouter:
    # Constructed as ray.serve._private.router does; a fixed clock keeps cached queue lengths fresh.
    router = PrefixAffinityRouter(deployment_id=DEPLOYMENT, handle_source=DeploymentHandleSource.REPLICA,
                                  use_replica_queue_len_cache=cache, get_curr_time_s=lambda: 0.0)
    router.initialize_state(**state)
    # Probes of the fakes answer within a few loop turns; a long deadline keeps a slow CI machine
    # from timing one out (a timed-out probe would send the request to the next rank).
    router.queue_len_response_deadline_s = router.max_queue_len_response_deadline_s = 60.0
    return router


def pending(route_key=None, request_id: str = "r") -> PendingRequest:
    kwargs = {"prompt_ids": [1, 2, 3]} if route_key is None else {"prompt_ids": [1, 2, 3], "route_key": route_key}
    return PendingRequest(args=[], kwargs=kwargs, metadata=RequestMetadata(request_id=request_id,
                                                                            internal_request_id=request_id))


_NO_REQUEST = object()


def choose(router, replicas, route_key=None, request_out: list | None = None):
    """One choose_replicas call for a request with this key (``_NO_REQUEST``: with no request).
    PendingRequest makes an asyncio future, so the request is built inside the loop."""

    async def main():
        request = None if route_key is _NO_REQUEST else pending(route_key)
        if request_out is not None:
            request_out.append(request)
        return await router.choose_replicas(replicas, request)

    return asyncio.run(main())


def winner(key: int, replicas) -> FakeReplica:
    return replicas[rendezvous_order(key, [r.replica_id.unique_id for r in replicas])[0]]


# ------------------------------------------------------------------ route keys

def test_route_key_depends_on_leading_full_blocks_and_salt():
    prompt = list(range(100, 120))  # 5 full blocks of 4
    key = prefix_route_key(prompt, BS)
    assert isinstance(key, int) and 0 <= key < 2**64
    assert prefix_route_key(list(prompt), BS) == key
    assert prefix_route_key(prompt[:16] + [7, 7, 7, 7, 1], BS) == key  # beyond 4 blocks: ignored
    assert prefix_route_key(prompt[:16] + [1, 2], BS) == key  # a partial block: ignored
    assert prefix_route_key(prompt[:5] + [0] + prompt[6:], BS) != key  # block 2 differs
    assert prefix_route_key(prompt[:15] + [0], BS) != key  # block 4 differs
    assert prefix_route_key(prompt, BS, prefix_blocks=5) != key
    assert prefix_route_key(prompt, BS, prefix_blocks=1) == prefix_route_key(prompt[:4] + [9], BS)
    # Fewer full blocks give the key of just those blocks (not that of a longer prompt).
    assert prefix_route_key(prompt[:8], BS) != key
    assert prefix_route_key(prompt[:8], BS) == prefix_route_key(prompt[:8] + [5, 5], BS)
    salted = prefix_route_key(prompt, BS, cache_salt="tenant-a")
    assert salted not in (key, prefix_route_key(prompt, BS, cache_salt="tenant-b"))
    assert prefix_route_key(prompt, BS, cache_salt="") not in (key, salted)
    assert salted == prefix_route_key(prompt[:16], BS, cache_salt="tenant-a")


def test_route_key_none_without_a_full_block():
    assert prefix_route_key([], BS) is None
    assert prefix_route_key([1, 2, 3], BS) is None
    assert prefix_route_key([1, 2, 3], BS, cache_salt="s") is None
    assert prefix_route_key([1, 2, 3, 4], BS) is not None
    with pytest.raises(ValueError):
        prefix_route_key([1, 2, 3, 4], 0)
    with pytest.raises(ValueError):
        prefix_route_key([1, 2, 3, 4], BS, prefix_blocks=0)


CROSS_PROCESS = """
import json, sys
from aioinfer.ray.routing import prefix_route_key, rendezvous_order
prompts = json.loads(sys.argv[1])
keys = [prefix_route_key(p, 4, cache_salt=s) for p, s in prompts]
ids = [f"replica-{i}" for i in range(6)]
print(json.dumps({"keys": keys, "orders": [rendezvous_order(k, ids) for k in keys if k is not None]}))
"""


def test_keys_and_orders_equal_across_processes():
    prompts = [(list(range(i, i + 9 + i)), None) for i in range(10)] + [([5] * 16, "salt-é"), ([1, 2], None)]

    def run(seed: str) -> dict:
        env = dict(os.environ, PYTHONHASHSEED=seed)
        out = subprocess.run([sys.executable, "-c", CROSS_PROCESS, json.dumps(prompts)], cwd=REPO, env=env,
                             capture_output=True, text=True, timeout=120, check=True)
        return json.loads(out.stdout)

    keys = [prefix_route_key(p, 4, cache_salt=s) for p, s in prompts]
    ids = [f"replica-{i}" for i in range(6)]
    here = {"keys": keys, "orders": [rendezvous_order(k, ids) for k in keys if k is not None]}
    assert keys[-1] is None and len(set(keys[:-1])) == len(keys) - 1
    assert run("0") == here
    assert run("4242") == here


# ------------------------------------------------------------------ rendezvous

def test_rendezvous_moves_only_the_keys_of_a_replica_that_comes_or_goes():
    ids = [f"replica-{i}" for i in range(8)]
    keys = [prefix_route_key([k, k + 1, k + 2, k + 3], BS) for k in range(500)]
    best = {k: ids[rendezvous_order(k, ids)[0]] for k in keys}
    assert all(sorted(rendezvous_order(k, ids)) == list(range(8)) for k in keys[:20])
    # The order is of the ids, not of their positions.
    shuffled = ids[3:] + ids[:3]
    assert all(shuffled[rendezvous_order(k, shuffled)[0]] == best[k] for k in keys)

    survivors = [i for i in ids if i != "replica-3"]
    moved = 0
    for k in keys:
        new = survivors[rendezvous_order(k, survivors)[0]]
        if best[k] == "replica-3":
            moved += 1
        else:
            assert new == best[k]
    assert moved > 0

    grown = ids + ["replica-8"]
    taken = 0
    for k in keys:
        new = grown[rendezvous_order(k, grown)[0]]
        assert new in (best[k], "replica-8")
        taken += new == "replica-8"
    assert taken > 0


# ------------------------------------------------------------------ the router's choices

def test_same_key_same_replica_and_keys_spread():
    router = make_router()
    replicas = [FakeReplica(f"r{i}") for i in range(4)]
    keys = [prefix_route_key(list(range(k, k + 8)), BS) for k in range(200)]
    chosen = {}
    for k in keys:
        ranks = choose(router, replicas, k)
        assert [len(rank) for rank in ranks] == [1, 1]  # preferred, then the next by rendezvous
        assert ranks[0][0] is winner(k, replicas) and ranks[1][0] is not ranks[0][0]
        chosen[k] = ranks[0][0]
    for _ in range(3):  # repeated calls, and a router of another process (a fresh one), agree
        other = make_router()
        for k in keys[:20]:
            assert choose(router, replicas, k)[0][0] is chosen[k]
            assert choose(other, list(reversed(replicas)), k)[0][0] is chosen[k]
    per_replica = [sum(c is r for c in chosen.values()) for r in replicas]
    assert min(per_replica) >= 25, per_replica  # 50 expected each
    assert router.decisions == {"by_affinity": 260, "fallback_imbalance": 0, "no_key": 0}


def test_no_key_is_power_of_two_choices():
    router = make_router()
    replicas = [FakeReplica(f"r{i}") for i in range(5)]
    made: list = []
    ranks = choose(router, replicas, None, made)
    assert len(ranks) == 1 and len(ranks[0]) == 2 and ranks[0][0] is not ranks[0][1]
    assert all(r in replicas for r in ranks[0])
    assert made[0].routing_context.should_backoff
    assert choose(router, replicas, _NO_REQUEST)[0][0] in replicas
    assert choose(router, replicas[:1], None) == [[replicas[0]]]
    assert choose(router, [], 5) == []
    assert router.decisions == {"by_affinity": 0, "fallback_imbalance": 0, "no_key": 3}


def test_imbalance_and_full_replicas_fall_back_to_power_of_two():
    router = make_router(imbalance_threshold=3, num_fallback_replicas=2)
    replicas = [FakeReplica(f"r{i}", max_ongoing_requests=10) for i in range(4)]
    key = prefix_route_key([9, 8, 7, 6], BS)
    preferred = winner(key, replicas)
    # Unknown queue lengths never count as overload.
    assert [len(rank) for rank in choose(router, replicas, key)] == [1, 1, 1]
    for r in replicas:
        router.on_new_queue_len_info(r.replica_id, 2)
    router.on_new_queue_len_info(preferred.replica_id, 5)  # least + threshold: still preferred
    assert choose(router, replicas, key)[0] == [preferred]
    router.on_new_queue_len_info(preferred.replica_id, 6)  # least + threshold + 1: pow-2
    ranks = choose(router, replicas, key)
    assert len(ranks) == 1 and len(ranks[0]) == 2 and ranks[0][0] is not ranks[0][1]
    for r in replicas:
        router.on_new_queue_len_info(r.replica_id, 9)
    router.on_new_queue_len_info(preferred.replica_id, 10)  # full, though balanced
    assert len(choose(router, replicas, key)) == 1
    assert router.decisions == {"by_affinity": 2, "fallback_imbalance": 2, "no_key": 0}
    # Without Ray's queue-length cache nothing is known: affinity always.
    blind = make_router(cache=False)
    assert choose(blind, replicas, key) == [[preferred], [replicas[rendezvous_order(
        key, [r.replica_id.unique_id for r in replicas])[1]]]]


def test_initialize_state_checks_its_options():
    with pytest.raises(ValueError):
        make_router(imbalance_threshold=-1)
    with pytest.raises(ValueError):
        make_router(num_fallback_replicas=1.5)
    router = make_router(imbalance_threshold=0, num_fallback_replicas=0, unknown_option=1)
    replicas = [FakeReplica(f"r{i}") for i in range(3)]
    assert len(choose(router, replicas, 123)) == 1


# ------------------------------------------------------------------ through Ray's routing loop

def test_ray_routing_loop_takes_the_preferred_then_the_next_replica():
    """RequestRouter's own loop (queue-length probes, rejection of full replicas, ranks): the
    rendezvous winner when it has room, the next replica by rendezvous when it is full."""

    async def main() -> None:
        replicas = [FakeReplica(f"r{i}", max_ongoing_requests=4) for i in range(4)]
        router = make_router(cache=False)
        router.update_replicas(replicas)
        keys = [prefix_route_key(list(range(k, k + 4)), BS) for k in range(12)]
        for i, k in enumerate(keys):
            got = await router._choose_replica_for_request(pending(k, request_id=f"a{i}"))
            assert got is winner(k, replicas)
        key = keys[0]
        order = rendezvous_order(key, [r.replica_id.unique_id for r in replicas])
        replicas[order[0]].queue_len = 4  # full: rejects
        got = await router._choose_replica_for_request(pending(key, request_id="b"))
        assert got is replicas[order[1]]

    asyncio.run(asyncio.wait_for(main(), timeout=60))


@pytest.mark.parametrize("cache", [False, True])
def test_concurrent_requests_each_get_their_keys_replica(cache):
    """Replicas answering probes at different speeds complete routing out of arrival order; each
    request must still get its own key's replica. (With FIFOMixin, the replica found for one
    request goes to the head of the queue: about half of these were misrouted.)"""

    async def main() -> None:
        replicas = [FakeReplica(f"r{i}", probe_yields=3 * i) for i in range(4)]
        router = make_router(cache=cache)
        router.update_replicas(replicas)
        keys = [prefix_route_key(list(range(k, k + 4)), BS) for k in range(40)]
        requests = [pending(k, request_id=f"c{i}") for i, k in enumerate(keys)]
        got = await asyncio.gather(*(router._choose_replica_for_request(r) for r in requests))
        assert got == [winner(k, replicas) for k in keys]
        assert {r.replica_id.unique_id for r in got} == {"r0", "r1", "r2", "r3"}

    asyncio.run(asyncio.wait_for(main(), timeout=60))
