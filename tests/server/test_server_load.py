"""A real hypercorn process under load: 64 concurrent streams, disconnects, overload, a dying engine."""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest

from aioinfer import LLM, SamplingParams
from server_process import metric, metric_samples, run_server, wait_idle
from tiny_models import make_tiny_model_dir

BASE_ENV = {"AIOINFER_DEVICE": "cpu", "AIOINFER_DTYPE": "float32", "AIOINFER_MAX_NUM_BATCHED_TOKENS": "512"}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(make_tiny_model_dir(tmp_path_factory.mktemp("qwen2"), arch="qwen2"))


def prompt_for(i: int) -> list[int]:
    return [(7 * i + k) % 400 + 3 for k in range(3 + i % 17)]


def test_64_concurrent_streams_are_batched_and_correct(model_dir, tmp_path):
    n = 64
    prompts = [prompt_for(i) for i in range(n)]
    expected = [o.outputs[0].text for o in LLM(model=model_dir, dtype="float32", device="cpu").generate(
        prompts, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True), use_tqdm=False)]

    with run_server({**BASE_ENV, "AIOINFER_MODEL": model_dir}, tmp_path) as server:
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key="none", max_retries=0, timeout=120)

        async def one(prompt):
            text, usage = "", None
            stream = await client.completions.create(
                model=client_model(server), prompt=prompt, max_tokens=16, temperature=0, stream=True,
                stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
            async for chunk in stream:
                text += "".join(choice.text for choice in chunk.choices)
                usage = chunk.usage or usage
            return text, usage

        async def run_all():
            async with client:  # closed on this loop: a client left to the garbage collector closes on a dead one
                return await asyncio.gather(*(one(p) for p in prompts))

        results = asyncio.run(run_all())
        assert [text for text, _ in results] == expected
        assert all(usage.completion_tokens == 16 for _, usage in results)

        samples = wait_idle(server)
        steps = metric(samples, "aioinfer:step_batched_requests_count")
        single = metric(samples, "aioinfer:step_batched_requests_bucket", le="1.0")
        assert steps > single, "no step ever ran more than one request"
        assert metric(samples, "vllm:request_success_total", finished_reason="length") >= n


def client_model(server) -> str:
    return httpx.get(server.url + "/v1/models").json()["data"][0]["id"]


def test_disconnects_free_all_blocks(model_dir, tmp_path):
    env = {**BASE_ENV, "AIOINFER_MODEL": model_dir, "AIOINFER_MAX_NUM_SEQS": "1"}
    with run_server(env, tmp_path) as server:
        body = {"prompt": prompt_for(3), "max_tokens": 400, "temperature": 0, "stream": True,
                "ignore_eos": True}
        with httpx.Client(timeout=60) as client:
            # mid-stream: read a few chunks, then drop the connection
            with client.stream("POST", server.url + "/v1/completions", json=body) as running:
                lines = running.iter_lines()
                got = [next(lines) for _ in range(6)]
                assert any(line.startswith("data: {") for line in got)
                # while that one runs (max_num_seqs=1), a second one waits in the queue: drop it too
                with httpx.Client(timeout=60) as other:
                    with other.stream("POST", server.url + "/v1/completions", json=body) as queued:
                        assert queued.status_code == 200
                        deadline = time.monotonic() + 30
                        while metric(metric_samples(server), "vllm:num_requests_waiting") < 1:
                            assert time.monotonic() < deadline, "the second request never queued"
                            time.sleep(0.05)
        samples = wait_idle(server)
        assert metric(samples, "aioinfer:requests_aborted_total") >= 2
        assert httpx.get(server.url + "/health").status_code == 200


def test_overload_gets_429_and_accepted_requests_complete(model_dir, tmp_path):
    env = {**BASE_ENV, "AIOINFER_MODEL": model_dir, "AIOINFER_MAX_NUM_SEQS": "2", "AIOINFER_MAX_WAITING_REQUESTS": "3"}
    prompts = [prompt_for(i) for i in range(60)]
    expected = [o.outputs[0].text for o in LLM(model=model_dir, dtype="float32", device="cpu").generate(
        prompts, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True), use_tqdm=False)]
    with run_server(env, tmp_path) as server:
        async def burst():
            async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=100)) as client:
                async def one(p):
                    return await client.post(server.url + "/v1/completions", json={
                        "prompt": p, "max_tokens": 24, "temperature": 0, "ignore_eos": True})
                return await asyncio.gather(*(one(p) for p in prompts))

        responses = asyncio.run(burst())
        codes = [r.status_code for r in responses]
        assert set(codes) <= {200, 429}, codes
        assert codes.count(429) > 0 and codes.count(200) > 0
        for i, r in enumerate(responses):
            if r.status_code == 429:
                assert float(r.headers["Retry-After"]) > 0
                assert r.json()["error"]["code"] is not None or r.json()["error"]["type"]
            else:
                assert r.json()["choices"][0]["text"] == expected[i]
        samples = wait_idle(server)
        assert metric(samples, "aioinfer:requests_rejected_total", reason="overloaded") == codes.count(429)


def test_step_loop_failure_reaches_clients_and_health(model_dir, tmp_path):
    env = {**BASE_ENV, "AIOINFER_MODEL": model_dir, "AIOINFER_FAULT_INJECT_STEP": "6"}
    with run_server(env, tmp_path) as server:
        assert httpx.get(server.url + "/health").status_code == 200
        body = {"prompt": prompt_for(1), "max_tokens": 100, "temperature": 0, "ignore_eos": True}
        with httpx.Client(timeout=60) as client:
            with client.stream("POST", server.url + "/v1/completions", json={**body, "stream": True}) as r:
                events = [line for line in r.iter_lines() if line.startswith("data: ")]
            assert any('"error"' in e for e in events), events[-3:]
            response = client.post(server.url + "/v1/completions", json=body)
            assert response.status_code == 503 and "error" in response.json()
            assert client.get(server.url + "/health").status_code == 503
            assert client.get(server.url + "/ready").status_code == 503
            samples = metric_samples(server)  # a dead engine runs and queues nothing: no stale gauges
            assert metric(samples, "vllm:num_requests_running") == 0
            assert metric(samples, "vllm:num_requests_waiting") == 0
