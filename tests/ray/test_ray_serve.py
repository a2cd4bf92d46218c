"""The Ray Serve deployment on a real local Ray: two engine replicas of a tiny Qwen2 model behind the
OpenAI ingress (``aioinfer.entrypoints.ray_app:build_app``), driven by the official ``openai`` client
and compared with a single ``hypercorn aioinfer.app:app`` server of the same model and settings.

One Ray for the module (2 CPUs, no dashboard), the replicas reserving no CPU so that they fit the
2-core CI machine. The last test kills a replica: it runs last.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import httpx
import pytest

serve = pytest.importorskip("ray.serve")

import ray  # noqa: E402
from openai import OpenAI  # noqa: E402

from aioinfer.entrypoints.ray_app import APP_NAME, ENGINE_DEPLOYMENT, build_app  # noqa: E402
from aioinfer.ray.directory import ReplicaDirectory  # noqa: E402
from server_process import free_port, start_server  # noqa: E402
from tiny_models import make_tiny_model_dir  # noqa: E402

API_KEY = "sk-ray-test"
MAX_MODEL_LEN = 256
BLOCK = 16
ENGINE_OPTIONS = dict(dtype="float32", device="cpu", max_model_len=MAX_MODEL_LEN, block_size=BLOCK, num_kv_blocks=256,
                      cpu_threads=1)
PROMPTS = ["Hello, world! How are you", "我们今天去公园散步，", "The quick brown fox"]
WAIT = 60.0  # seconds any bounded wait below may take on a loaded 2-core machine


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(make_tiny_model_dir(tmp_path_factory.mktemp("qwen2"), arch="qwen2"))


@pytest.fixture(scope="module")
def single(model_dir):
    """The single-process server the deployment must answer like."""
    env = {"AIOINFER_" + k.upper(): str(v) for k, v in ENGINE_OPTIONS.items()}
    env.update(AIOINFER_MODEL=model_dir, AIOINFER_API_KEY=API_KEY)
    proc = start_server(env)
    yield proc
    proc.stop()
    proc.close_log()


@pytest.fixture(scope="module")
def deployment(model_dir):
    """Ray, Serve on a free port, and the application with 2 engine replicas; its URL."""
    port = free_port()
    ray.init(num_cpus=2, include_dashboard=False, namespace="serve", log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        args = {key: str(value) for key, value in ENGINE_OPTIONS.items()}  # as `serve run ... key=value` gives them
        args.update(model=model_dir, api_key=API_KEY, num_replicas="2", num_cpus_per_replica="0",
                    ingress_num_cpus="0", log_requests="false")
        serve.run(build_app(args), name=APP_NAME, route_prefix="/")
        url = f"http://127.0.0.1:{port}"
        _wait_for(lambda: httpx.get(url + "/ready", timeout=5).status_code == 200, "the ingress to be ready")
        yield url
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.fixture(scope="module")
def client(deployment):
    return OpenAI(base_url=deployment + "/v1", api_key=API_KEY, max_retries=0, timeout=WAIT)


@pytest.fixture(scope="module")
def single_client(single):
    return OpenAI(base_url=single.url + "/v1", api_key=API_KEY, max_retries=0, timeout=WAIT)


@pytest.fixture(scope="module")
def model_name(client):
    return client.models.list().data[0].id


def _wait_for(condition, what: str, timeout: float = WAIT):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = condition()
        except (httpx.HTTPError, ray.exceptions.RayError) as exc:
            last = exc
        if last and not isinstance(last, Exception):
            return last
        time.sleep(0.1)
    raise AssertionError(f"waited {timeout:g} s for {what}; last: {last!r}")


def replica_figures() -> dict[str, dict]:
    """Every engine replica's record_routing_stats(), by replica id."""
    directory = ReplicaDirectory(APP_NAME, ENGINE_DEPLOYMENT)
    actors = directory.actors()
    return asyncio.run(directory.routing_stats(actors, timeout=10))


def _headers() -> dict:
    return {"Authorization": f"Bearer {API_KEY}"}


# ---------------------------------------------------------------------------- the same answers

def test_completions_equal_the_single_server_streamed_or_not(client, single_client, model_name):
    single_name = single_client.models.list().data[0].id
    for prompt in PROMPTS:
        args = dict(prompt=prompt, max_tokens=12, temperature=0, extra_body={"return_token_ids": True})
        want = single_client.completions.create(model=single_name, **args).choices[0]
        got = client.completions.create(model=model_name, **args).choices[0]
        assert (got.text, got.finish_reason) == (want.text, want.finish_reason)
        assert got.model_extra["token_ids"] == want.model_extra["token_ids"]
        chunks = list(client.completions.create(model=model_name, stream=True, **args))
        assert "".join(c.choices[0].text for c in chunks if c.choices) == want.text
        assert [t for c in chunks if c.choices for t in (c.choices[0].model_extra.get("token_ids") or [])] == \
            want.model_extra["token_ids"]
    # One HTTP request, several engine requests at once (prompts x n): each its own Ray call.
    several = dict(prompt=PROMPTS, max_tokens=6, temperature=0, n=2)
    want = single_client.completions.create(model=single_name, **several)
    got = client.completions.create(model=model_name, **several)
    assert sorted((c.index, c.text) for c in got.choices) == sorted((c.index, c.text) for c in want.choices)
    texts: dict[int, str] = {}
    for chunk in client.completions.create(model=model_name, stream=True, **several):
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
    assert texts == {c.index: c.text for c in want.choices}
    messages = [{"role": "user", "content": "你好，世界！"}]
    want = single_client.chat.completions.create(model=single_name, messages=messages, max_tokens=8, temperature=0)
    got = client.chat.completions.create(model=model_name, messages=messages, max_tokens=8, temperature=0, n=3)
    assert [c.message.content for c in got.choices] == [want.choices[0].message.content] * 3


def test_a_shared_prefix_lands_on_the_replica_that_caches_it(client, model_name):
    # Each prefix is new to both replicas (a fresh uuid leads it): a cache hit on the second request
    # means it went to the first one's replica. Four prefixes: by chance alone, 1 in 16.
    for _ in range(4):
        prefix = uuid.uuid4().hex + " the quick brown fox jumps over the lazy dog" * 6
        first = client.completions.create(model=model_name, prompt=prefix + " first", max_tokens=2, temperature=0)
        assert first.usage.prompt_tokens >= 5 * BLOCK
        chunks = list(client.completions.create(model=model_name, prompt=prefix + " and a second ending",
                                                max_tokens=2, temperature=0, stream=True,
                                                stream_options={"include_usage": True}))
        assert chunks[-1].usage.prompt_tokens_details.cached_tokens >= 4 * BLOCK


def test_a_client_that_disconnects_mid_stream_frees_its_replica(deployment, model_name):
    aborted_before = sum(f["counters"]["aborted"] for f in replica_figures().values())
    body = {"model": model_name, "prompt": "Count with me: one, two, three,", "max_tokens": 200, "temperature": 0,
            "stream": True, "ignore_eos": True}
    with httpx.stream("POST", deployment + "/v1/completions", json=body, headers=_headers(), timeout=WAIT) as response:
        assert response.status_code == 200
        events = response.iter_lines()
        assert next(line for line in events if line.startswith("data: "))
    # The connection is closed: Ray cancels the ingress's request, which cancels the replica's stream.

    def all_free():
        figures = replica_figures()
        aborted = sum(f["counters"]["aborted"] for f in figures.values())
        return len(figures) == 2 and aborted == aborted_before + 1 and all(
            f["open_requests"] == 0 and f["num_running"] == 0 and f["kv_usage"] == 0 for f in figures.values())

    _wait_for(all_free, "every replica to have no open request and no KV in use")


# ---------------------------------------------------------------------------- the same errors

ERROR_CASES = [
    ("/v1/completions", {"prompt": "hi", "max_tokens": MAX_MODEL_LEN}),  # beyond the context: the replica's check
    ("/v1/completions", {"prompt": list(range(5, 5 + MAX_MODEL_LEN)), "max_tokens": 1}),
    ("/v1/completions", {"prompt": [10**6]}),
    ("/v1/completions", {"prompt": "hi", "temperature": -1}),
    ("/v1/completions", {"prompt": "hi", "logprobs": 21}),
    ("/v1/completions", {"prompt": "hi", "n": 100}),
    ("/v1/completions", {"model": "gpt-9", "prompt": "hi"}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 10**6}),
    ("/v1/completions", {"prompt": "hi", "structured_outputs": {"regex": "("}}),  # compiled by the replica
]


@pytest.mark.parametrize("path, body", ERROR_CASES, ids=[f"{i}" for i in range(len(ERROR_CASES))])
def test_bad_requests_get_the_single_server_s_answer(deployment, single, path, body):
    want = httpx.post(single.url + path, json=body, headers=_headers(), timeout=WAIT)
    got = httpx.post(deployment + path, json=body, headers=_headers(), timeout=WAIT)
    assert want.status_code in (400, 404), want.text
    assert (got.status_code, got.json()) == (want.status_code, want.json())


def test_the_api_key_is_required_as_by_the_single_server(deployment, single):
    body = {"prompt": "hi", "max_tokens": 2}
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        want = httpx.post(single.url + "/v1/completions", json=body, headers=headers, timeout=WAIT)
        got = httpx.post(deployment + "/v1/completions", json=body, headers=headers, timeout=WAIT)
        assert want.status_code == 401
        assert (got.status_code, got.json()) == (want.status_code, want.json())
        assert got.headers["WWW-Authenticate"] == want.headers["WWW-Authenticate"]
    for path in ("/health", "/ready"):  # open, as on the single server
        assert httpx.get(deployment + path, timeout=WAIT).status_code == 200


def test_metrics_carry_vllm_names_per_replica(deployment, client, model_name):
    client.completions.create(model=model_name, prompt=PROMPTS[0], max_tokens=4, temperature=0)

    def counted():
        text = httpx.get(deployment + "/metrics", timeout=WAIT).text
        total = 0.0
        for line in text.splitlines():
            if line.startswith("vllm:generation_tokens_total{"):
                total += float(line.rsplit(" ", 1)[1])
        return (total > 0 and 'vllm:kv_cache_usage_perc{engine="1"' in text
                and "vllm:e2e_request_latency_seconds" in text)

    _wait_for(counted, "the replicas' steps to reach /metrics")


# ---------------------------------------------------------------------------- a replica dies (last: it kills one)

def test_a_replica_killed_mid_stream_ends_its_stream_and_the_next_requests_succeed(deployment, client, model_name):
    body = {"model": model_name, "prompt": "Once upon a time", "max_tokens": 220, "temperature": 0,
            "stream": True, "ignore_eos": True}
    lines = []
    started = time.monotonic()
    with httpx.stream("POST", deployment + "/v1/completions", json=body, headers=_headers(), timeout=WAIT) as response:
        assert response.status_code == 200
        events = response.iter_lines()
        lines.append(next(line for line in events if line.startswith("data: ")))
        busy = _wait_for(lambda: [rid for rid, f in replica_figures().items() if f["open_requests"]],
                         "the replica serving the stream")
        directory = ReplicaDirectory(APP_NAME, ENGINE_DEPLOYMENT)
        ray.kill(directory.actors()[busy[0]], no_restart=True)
        try:
            lines.extend(events)  # must end: an error event, or the stream closed
        except httpx.HTTPError as exc:  # a closed connection is a clean end too, as long as it is not a hang
            lines.append(f"closed: {exc!r}")
    assert time.monotonic() - started < WAIT
    data = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    finished = [c for d in data for c in d.get("choices", ()) if c.get("finish_reason") == "length"]
    errors = [d["error"] for d in data if "error" in d]
    assert not finished, "the stream ran to its end: the replica was not killed in time"
    assert errors or lines[-1].startswith("closed"), lines[-3:]
    if errors:
        assert errors[0]["code"] == "engine_dead", errors
    # The next requests go to the replica left (or the one Ray starts in the dead one's place).
    for i in range(6):
        out = client.completions.create(model=model_name, prompt=f"{i} {PROMPTS[i % len(PROMPTS)]}", max_tokens=3,
                                        temperature=0)
        assert out.choices[0].finish_reason == "length"
    assert httpx.get(deployment + "/health", timeout=WAIT).status_code == 200
