"""The scheduler's bookkeeping checks, for tests (``Scheduler.check_invariants``): queues, statuses,
block tables, reservations and host runs agree; AssertionError names what drifted."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

from aioinfer.core.kv_cache_manager import cdiv
from aioinfer.request import RequestStatus

if TYPE_CHECKING:
    from aioinfer.core.scheduler import Scheduler


def check_scheduler_invariants(scheduler: "Scheduler") -> None:
    scheduler.kv_cache.check_invariants()
    assert len(scheduler.running) <= scheduler.config.max_num_seqs
    ids = [r.request_id for r in scheduler.running] + [r.request_id for r in scheduler.waiting]
    assert len(ids) == len(set(ids)) == len(scheduler.requests), "a request is queued twice or lost"
    keys = [r.order_key for r in scheduler.running]
    assert all(a < b for a, b in itertools.pairwise(keys)) and scheduler.waiting.is_sorted(), "queue order broken"
    block_size = scheduler.kv_cache.block_size
    for request in scheduler.running:
        assert request.status == RequestStatus.RUNNING
        assert scheduler.kv_cache.holds(request.request_id), f"{request.request_id} runs without a table"
        table = scheduler.kv_cache.block_ids(request.request_id)
        assert len(table) == cdiv(request.num_computed_tokens, block_size), (
            f"{request.request_id}: {len(table)} blocks for {request.num_computed_tokens} computed tokens")
        # Cached (possibly shared) blocks lie wholly before the computed tokens: never written again.
        assert scheduler.kv_cache.num_chain_blocks(request.request_id) * block_size <= request.num_computed_tokens
    host_runs = {}
    for request in scheduler.waiting:
        assert request.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED, RequestStatus.SWAPPED)
        assert not scheduler.kv_cache.holds(request.request_id), "a waiting request holds blocks or a reservation"
        if request.status == RequestStatus.SWAPPED:
            host_runs[request.host_run_start] = cdiv(request.num_computed_tokens, block_size)
        else:
            assert request.host_run_start is None
    scheduler.host_pool.check_invariants(host_runs)
