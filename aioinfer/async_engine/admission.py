"""Admission bounds of the async engine: how many requests (and prompt tokens) may wait unscheduled.

A request counts as waiting from ``generate`` until its first scheduled step. Three answers to
"may these requests come in?":

- yes: they are admitted, all of them;
- not now (``EngineOverloaded``, HTTP 429): the queue is full, but it drains; ``Retry-After`` is
  the time the queue needs, at the rate it has been draining, to make room for them;
- never (``AdmissionLimitExceeded``, HTTP 400): they need more room than the bounds have at all
  (an HTTP request's prompts x n above ``max_waiting_requests``, or prompts longer together than
  ``max_waiting_prompt_tokens``). A 429 there would be a lie that a client obeying it retries for
  ever, each attempt costing the engine nothing only because it is refused before any part of it
  is admitted (``check`` looks at the whole fan-out first).
"""

from __future__ import annotations

import time
from collections import deque
from typing import Optional, Sequence

from aioinfer.errors import AdmissionLimitExceeded, EngineOverloaded

RETRY_AFTER_MIN = 1.0  # seconds; Retry-After is sent in whole seconds
RETRY_AFTER_MAX = 30.0  # a longer estimate is worthless: the load will have changed by then
RETRY_AFTER_UNKNOWN = 5.0  # nothing has drained lately (a long prefill, or the first burst)
_DRAIN_WINDOW = 10.0  # seconds of departures the drain rate is measured over


class AdmissionQueue:
    """The waiting counts, the bounds and the drain rate (event-loop thread only)."""

    def __init__(self, max_requests: int, max_prompt_tokens: int) -> None:
        self.max_requests = max_requests
        self.max_prompt_tokens = max_prompt_tokens
        self.requests = 0  # admitted, not yet scheduled
        self.prompt_tokens = 0  # their prompt tokens
        # (time.monotonic(), requests, prompt tokens) that left the queue together, newest last
        self._departures: deque[tuple[float, int, int]] = deque()

    @property
    def room(self) -> tuple[int, int]:
        """(requests, prompt tokens) that may still enter now."""
        return self.max_requests - self.requests, self.max_prompt_tokens - self.prompt_tokens

    def has_room(self, num_requests: int, num_prompt_tokens: int) -> bool:
        return (self.requests + num_requests <= self.max_requests
                and self.prompt_tokens + num_prompt_tokens <= self.max_prompt_tokens)

    def never_fits(self, prompt_lengths: Sequence[int]) -> AdmissionLimitExceeded | None:
        """The error for requests that exceed the bounds even with an empty queue, else None."""
        count, total = len(prompt_lengths), sum(prompt_lengths)
        if count > self.max_requests:
            return AdmissionLimitExceeded(
                f"this request needs {count} engine requests (prompts x n) at once, more than the server's "
                f"max_waiting_requests ({self.max_requests}): it can never be admitted; send fewer prompts "
                f"or a smaller n", bound="max_waiting_requests", limit=self.max_requests, needed=count)
        if total > self.max_prompt_tokens:
            return AdmissionLimitExceeded(
                f"this request's prompts total {total} tokens (counted once per choice), more than the server's "
                f"max_waiting_prompt_tokens ({self.max_prompt_tokens}): it can never be admitted; send shorter "
                f"or fewer prompts, or a smaller n", bound="max_waiting_prompt_tokens",
                limit=self.max_prompt_tokens, needed=total)
        return None

    def check(self, prompt_lengths: Sequence[int]) -> None:
        """Raise unless all these requests can be admitted now (nothing is admitted here)."""
        error = self.never_fits(prompt_lengths)
        if error is not None:
            raise error
        count, total = len(prompt_lengths), sum(prompt_lengths)
        if not self.has_room(count, total):
            raise self.overloaded(count, total)

    def overloaded(self, num_requests: int, num_prompt_tokens: int) -> EngineOverloaded:
        return EngineOverloaded(
            f"the engine is at capacity ({self.requests} requests and {self.prompt_tokens} prompt tokens "
            f"waiting); retry later", retry_after=self.retry_after(num_requests, num_prompt_tokens))

    def enter(self, num_prompt_tokens: int) -> None:
        self.requests += 1
        self.prompt_tokens += num_prompt_tokens

    def leave(self, num_prompt_tokens: int, now: float) -> None:
        """One request left the queue (scheduled, or ended before it was) at ``now`` (monotonic)."""
        self.requests -= 1
        self.prompt_tokens -= num_prompt_tokens
        departures = self._departures
        if departures and departures[-1][0] == now:  # the same step: one record for all its requests
            _, n, tokens = departures[-1]
            departures[-1] = (now, n + 1, tokens + num_prompt_tokens)
        else:
            departures.append((now, 1, num_prompt_tokens))
            while departures[0][0] < now - _DRAIN_WINDOW:
                departures.popleft()

    def retry_after(self, num_requests: int, num_prompt_tokens: int, now: Optional[float] = None) -> float:
        """Seconds until the queue, draining as it has lately, has room for these requests; bounded."""
        if now is None:
            now = time.monotonic()
        departures = self._departures
        while departures and departures[0][0] < now - _DRAIN_WINDOW:
            departures.popleft()
        excess_requests = self.requests + num_requests - self.max_requests
        excess_tokens = self.prompt_tokens + num_prompt_tokens - self.max_prompt_tokens
        if len(departures) < 2:
            return RETRY_AFTER_UNKNOWN
        span = max(now - departures[0][0], 1e-3)
        request_rate = sum(d[1] for d in departures) / span
        token_rate = sum(d[2] for d in departures) / span
        wait = 0.0
        if excess_requests > 0:
            wait = max(wait, excess_requests / request_rate)
        if excess_tokens > 0:
            wait = max(wait, excess_tokens / token_rate) if token_rate > 0 else RETRY_AFTER_MAX
        return min(RETRY_AFTER_MAX, max(RETRY_AFTER_MIN, wait))



def fits_across(prompt_lengths: Sequence[int], rooms: Sequence[tuple[int, int]]) -> bool:
    """Whether requests of these prompt lengths can be spread over queues with these rooms
    ((requests, prompt tokens) each), longest prompt first into the queue with the most token room:
    the data-parallel engine's check of a whole fan-out over its replicas."""
    free = [list(room) for room in rooms]
    for length in sorted(prompt_lengths, reverse=True):
        best = None
        for room in free:
            if room[0] >= 1 and room[1] >= length and (best is None or room[1] > best[1]):
                best = room
        if best is None:
            return False
        best[0] -= 1
        best[1] -= length
    return True


def replicas_limit_error(prompt_lengths: Sequence[int], queues: Sequence[AdmissionQueue]) -> AdmissionLimitExceeded:
    """The never-admissible error of a data-parallel engine whose replicas' bounds cannot hold these."""
    count, total = len(prompt_lengths), sum(prompt_lengths)
    max_requests = sum(q.max_requests for q in queues)
    bound, limit, needed = (("max_waiting_requests", max_requests, count) if count > max_requests else
                            ("max_waiting_prompt_tokens", max(q.max_prompt_tokens for q in queues), max(prompt_lengths)))
    return AdmissionLimitExceeded(
        f"this request's {count} engine requests (prompts x n, {total} prompt tokens) cannot fit the admission "
        f"queues of the {len(queues)} replicas even when they are empty (each holds max_waiting_requests="
        f"{queues[0].max_requests} and max_waiting_prompt_tokens={queues[0].max_prompt_tokens}): it can never "
        f"be admitted; send fewer or shorter prompts, or a smaller n", bound=bound, limit=limit, needed=needed)
