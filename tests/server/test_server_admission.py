"""Admission and slow clients on a real ``hypercorn aioinfer.app:app`` process.

- A request whose prompts x n can never fit the admission bounds gets a 400 naming the bound, at
  any load, and costs the engine nothing (no part of it is admitted, so nothing is aborted).
- A request that does not fit now gets a 429 with a Retry-After, and no part of it is admitted.
- A streaming client that stops reading is aborted (KV freed, counted) even when the kernel's
  buffers could hold its whole stream, and the server closes its connection.
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from server_process import metric, metric_samples, start_server
from tiny_models import make_tiny_model_dir

MAX_WAITING = 3


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model_dir = make_tiny_model_dir(tmp_path_factory.mktemp("qwen2"), arch="qwen2", max_position_embeddings=4096)
    env = {"AIOINFER_MODEL": str(model_dir), "AIOINFER_DEVICE": "cpu", "AIOINFER_DTYPE": "float32",
           "AIOINFER_NUM_KV_BLOCKS": "1024", "AIOINFER_MAX_NUM_SEQS": "1",  # one runs, the rest wait
           "AIOINFER_MAX_WAITING_REQUESTS": str(MAX_WAITING), "AIOINFER_MAX_WAITING_PROMPT_TOKENS": "1000",
           "AIOINFER_STALL_TIMEOUT": "1", "AIOINFER_MAX_N": "64"}
    proc = start_server(env)
    yield proc
    proc.stop()
    proc.close_log()


def wait_for(server, predicate, timeout: float = 120.0) -> list:
    """Poll /metrics until ``predicate(samples)`` holds (bounded, asserted)."""
    deadline = time.monotonic() + timeout
    while True:
        samples = metric_samples(server)
        if predicate(samples):
            return samples
        assert time.monotonic() < deadline, "the server never reached the expected state"
        time.sleep(0.05)


def idle(samples) -> bool:
    return (metric(samples, "vllm:num_requests_running") == 0 and metric(samples, "vllm:num_requests_waiting") == 0
            and metric(samples, "vllm:kv_cache_usage_perc") == 0)


def ended(samples) -> float:
    return metric(samples, "vllm:request_success_total")


def test_never_admissible_is_a_400_naming_the_bound(server):
    before = wait_for(server, idle)
    too_many = httpx.post(server.url + "/v1/completions", timeout=30,
                          json={"prompt": ["a", "b"], "n": 2, "max_tokens": 1})  # 4 choices, 3 places
    assert too_many.status_code == 400, too_many.text
    error = too_many.json()["error"]
    assert error["code"] == "admission_limit_exceeded" and error["param"] == "n"
    assert "max_waiting_requests (3)" in error["message"] and "Retry-After" not in too_many.headers
    too_long = httpx.post(server.url + "/v1/completions", timeout=30,
                          json={"prompt": [5] * 1001, "max_tokens": 1})  # one prompt over the token bound
    assert too_long.status_code == 400 and "max_waiting_prompt_tokens (1000)" in too_long.json()["error"]["message"]
    after = metric_samples(server)
    assert ended(after) == ended(before)  # nothing was admitted, so nothing was aborted
    assert metric(after, "aioinfer:requests_rejected_total", reason="invalid") == \
        metric(before, "aioinfer:requests_rejected_total", reason="invalid") + 2


def test_full_queue_is_a_429_and_admits_no_part(server):
    before = wait_for(server, idle)
    results = {}

    def post(name, body):
        results[name] = httpx.post(server.url + "/v1/completions", json=body, timeout=120)

    # A runs (the only running slot); B's two choices wait behind it and fill 2 of the 3 places.
    runner = threading.Thread(target=post, args=("a", {"prompt": [7], "max_tokens": 1500, "ignore_eos": True}))
    runner.start()
    wait_for(server, lambda s: metric(s, "vllm:num_requests_running") == 1)
    waiter = threading.Thread(target=post, args=("b", {"prompt": [8], "n": 2, "max_tokens": 2, "ignore_eos": True}))
    waiter.start()
    wait_for(server, lambda s: metric(s, "vllm:num_requests_waiting") == 2)

    full = httpx.post(server.url + "/v1/completions", json={"prompt": [9], "n": 2, "max_tokens": 1}, timeout=30)
    assert full.status_code == 429, full.text
    assert full.json()["error"]["code"] == "engine_overloaded"
    assert int(full.headers["Retry-After"]) >= 1  # whole seconds, from the queue's drain rate
    never = httpx.post(server.url + "/v1/completions", json={"prompt": [9], "n": 4, "max_tokens": 1}, timeout=30)
    assert never.status_code == 400  # at any load: a 429 would be retried for ever

    runner.join()
    waiter.join()
    assert results["a"].status_code == 200 and results["b"].status_code == 200
    after = wait_for(server, idle)
    assert ended(after) == ended(before) + 3  # A and B's two choices, and not one aborted part of C
    assert metric(after, "vllm:request_success_total", finished_reason="abort") == \
        metric(before, "vllm:request_success_total", finished_reason="abort")


def test_a_client_that_stops_reading_is_aborted_and_disconnected(server):
    """3000 tokens of SSE with two logprobs each are ~1.8 MB: the kernel's buffers (~4 MB) would hold
    all of it, so a stall limit counted at the response writer would never fire and the request would
    hold its KV to the end."""
    before = wait_for(server, idle)
    body = {"prompt": [11, 12], "max_tokens": 3000, "ignore_eos": True, "stream": True, "logprobs": 2}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=120) as response:
        if response.status_code != 200:
            pytest.fail(f"{response.status_code}: {response.read()!r}")
        chunks = response.iter_raw()
        next(chunks)  # the first event arrived; from now on this client reads nothing

        def aborted_or_finished(samples):
            return (metric(samples, "aioinfer:requests_aborted_total", cause="slow_consumer") >
                    metric(before, "aioinfer:requests_aborted_total", cause="slow_consumer")
                    or ended(samples) > ended(before))

        samples = wait_for(server, aborted_or_finished, timeout=600)  # generous: a loaded CI box is slow
        assert metric(samples, "vllm:request_success_total", finished_reason="length") == \
            metric(before, "vllm:request_success_total", finished_reason="length"), "it ran to the end"
        wait_for(server, idle)  # its KV blocks are free
        with pytest.raises(httpx.RemoteProtocolError):  # the server closed the connection
            for _ in chunks:
                pass
