"""Admission bounds: never-admissible requests are ValueErrors (HTTP 400), full queues are
EngineOverloaded with a drain-rate Retry-After, and a fan-out is checked whole before any part runs."""

from __future__ import annotations

import anyio
import pytest

from aioinfer import Engine, SamplingParams
from aioinfer.async_engine.admission import (
    RETRY_AFTER_MAX,
    RETRY_AFTER_MIN,
    RETRY_AFTER_UNKNOWN,
    AdmissionQueue,
    fits_across,
)
from aioinfer.errors import AdmissionLimitExceeded, EngineOverloaded
from tiny_models import make_tiny_model_dir

OPTIONS = dict(dtype="float32", device="cpu", max_model_len=256, num_kv_blocks=128, block_size=16)


def test_never_fits_names_the_bound():
    queue = AdmissionQueue(max_requests=512, max_prompt_tokens=1000)
    with pytest.raises(AdmissionLimitExceeded) as info:
        queue.check([1] * 576)  # 9 prompts x n=64
    assert info.value.bound == "max_waiting_requests" and info.value.limit == 512 and info.value.needed == 576
    assert "max_waiting_requests (512)" in str(info.value) and isinstance(info.value, ValueError)
    with pytest.raises(AdmissionLimitExceeded) as info:
        queue.check([600, 600])
    assert info.value.bound == "max_waiting_prompt_tokens" and info.value.needed == 1200
    queue.check([1] * 512)  # exactly the bound: fine
    assert queue.requests == 0  # check admits nothing


def test_full_queue_is_overloaded_not_never():
    queue = AdmissionQueue(max_requests=4, max_prompt_tokens=100)
    for _ in range(3):
        queue.enter(10)
    queue.check([10])
    with pytest.raises(EngineOverloaded):
        queue.check([10, 10])  # fits an empty queue, not this one
    with pytest.raises(AdmissionLimitExceeded):
        queue.check([10] * 5)  # never, whatever the queue holds


def test_retry_after_follows_the_drain_rate():
    queue = AdmissionQueue(max_requests=10, max_prompt_tokens=10_000)
    for _ in range(10):
        queue.enter(5)
    assert queue.retry_after(1, 5, now=100.0) == RETRY_AFTER_UNKNOWN  # nothing drained yet
    # Two requests leave per second for 4 s, and the queue refills behind them.
    for step in range(9):
        now = 100.0 + step * 0.5
        queue.leave(5, now)
        queue.enter(5)
    # 9 departures from 100.0 s to now = 104.5 s: 2 a second; 6 requests too many -> 3 s.
    assert queue.retry_after(6, 30, now=104.5) == pytest.approx(3.0)
    assert queue.retry_after(1, 5, now=104.5) == RETRY_AFTER_MIN  # half a second: rounded up to the floor
    assert queue.retry_after(1000, 5, now=104.5) == RETRY_AFTER_MAX  # bounded


def test_fits_across_replicas():
    assert fits_across([5, 5, 5], [(2, 10), (2, 10)])
    assert not fits_across([5, 5, 5], [(1, 10), (1, 10)])  # three requests, two slots
    assert not fits_across([11], [(5, 10), (5, 10)])  # longer than any one replica holds
    assert fits_across([8, 2, 2, 8], [(2, 10), (2, 10)])  # longest first: 8+2 | 8+2


def test_engine_rejects_never_admissible_requests_without_admitting_any(tmp_path):
    model_dir = make_tiny_model_dir(tmp_path, arch="qwen2")

    async def main():
        async with Engine(str(model_dir), **OPTIONS, max_waiting_requests=4, max_waiting_prompt_tokens=20) as engine:
            with pytest.raises(AdmissionLimitExceeded):
                engine.generate([1] * 21, SamplingParams(max_tokens=1))  # one prompt over the token bound
            with pytest.raises(AdmissionLimitExceeded):
                engine.check_admission([1, 1, 1, 1, 1])  # a fan-out of five over four places
            assert engine.stats()["open_requests"] == 0 and engine.stats()["waiting_admission"] == 0
            assert engine.counters["rejected_overloaded"] == 0  # not an overload: retrying cannot help
            deltas = [d async for d in engine.generate([1] * 20, SamplingParams(max_tokens=2, ignore_eos=True))]
            assert deltas[-1].finish_reason == "length"

    anyio.run(main)
