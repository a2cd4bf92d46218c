"""Scheduling order with priorities and aging (pure Python).

Every request gets one key when it arrives: ``(priority * aging_steps + arrival_step, arrival_seq)``,
smallest first. So a lower priority value runs first (vLLM's convention), requests of one priority
run in arrival order (FCFS), and waiting ages a request: a request that arrived ``aging_steps``
scheduler steps earlier ranks as if its priority were one level better, so any request eventually
outranks every later arrival (no starvation). Because all requests age at the same rate, the key
never changes: the order is static, and a sorted list serves the waiting queue and the running
set alike (admit from the front of one, preempt from the back of the other). Steps rather than
seconds make the rule deterministic in tests and independent of the hardware's step time.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterator

from aioinfer.request import Request

# One priority level per this many scheduler steps since arrival (~10-40 s at typical step times).
PRIORITY_AGING_STEPS = 1000


def order_key(priority: int, arrival_step: int, arrival_seq: int, aging_steps: int) -> tuple[int, int]:
    return (priority * aging_steps + arrival_step, arrival_seq)


def outranks(request: Request, other: Request) -> bool:
    """Whether ``request`` may preempt ``other``: a strictly better priority, aging included.

    The aged key alone would let an earlier arrival of equal priority preempt (FCFS is no reason to
    evict a running request), so the plain priority must be better too: aging only protects an old
    request from a later, better arrival, it never makes a request preempt its equals or betters.
    """
    return request.priority < other.priority and request.order_key[0] < other.order_key[0]


def _key(request: Request) -> tuple[int, int]:
    return request.order_key


def insert_ordered(requests: list[Request], request: Request) -> None:
    """Insert into a list kept sorted by ``order_key`` (keys are unique: the sequence breaks ties)."""
    bisect.insort(requests, request, key=_key)


class RequestQueue:
    """Waiting requests (new, preempted and swapped), smallest ``order_key`` first."""

    def __init__(self) -> None:
        self._requests: list[Request] = []

    def __len__(self) -> int:
        return len(self._requests)

    def __bool__(self) -> bool:
        return bool(self._requests)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._requests)

    def __contains__(self, request: Request) -> bool:
        i = bisect.bisect_left(self._requests, request.order_key, key=_key)
        return i < len(self._requests) and self._requests[i] is request

    def push(self, request: Request) -> None:
        insert_ordered(self._requests, request)

    def peek(self) -> Request:
        return self._requests[0]

    def pop(self) -> Request:
        return self._requests.pop(0)

    def remove(self, request: Request) -> None:
        i = bisect.bisect_left(self._requests, request.order_key, key=_key)
        if i >= len(self._requests) or self._requests[i] is not request:
            raise ValueError(f"request {request.request_id} is not waiting")
        del self._requests[i]

    def is_sorted(self) -> bool:
        keys = [r.order_key for r in self._requests]
        return all(a < b for a, b in itertools.pairwise(keys))
