"""Issue 18: every metric family vLLM's Grafana dashboards query is on /metrics after traffic.

The families come from tests/vllm_dashboard_families.py (the "expr" fields of vLLM's overview dashboard
and of its older one). One real server on a tiny model serves a few completions (one streamed, two
sharing a prefix) and one 4xx; the scrape is parsed with prometheus_client's parser. No check depends
on timing: counts only, never durations.
"""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from server_process import metric, run_server
from tiny_models import make_tiny_model_dir
from vllm_dashboard_families import OLDER, OVERVIEW

PREFIX = list(range(5, 21))  # 16 tokens: four full blocks of 4, shared by two prompts


def _family(name: str) -> str:
    """A family's name as the dashboards and the parser may spell it: counters without ``_total``."""
    return name[: -len("_total")] if name.endswith("_total") else name


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(make_tiny_model_dir(tmp_path_factory.mktemp("qwen2"), arch="qwen2"))


@pytest.fixture(scope="module")
def scrape(model_dir, tmp_path_factory):
    """(families by normalised name, samples) of /metrics after the traffic below."""
    env = {"AIOINFER_MODEL": model_dir, "AIOINFER_DEVICE": "cpu", "AIOINFER_DTYPE": "float32",
           "AIOINFER_NUM_KV_BLOCKS": "64", "AIOINFER_BLOCK_SIZE": "4", "AIOINFER_ENABLE_PREFIX_CACHING": "1"}
    with run_server(env, tmp_path_factory.mktemp("server")) as server:
        url = server.url + "/v1/completions"
        bodies = [
            {"prompt": PREFIX + [30, 31], "max_tokens": 4, "ignore_eos": True},
            {"prompt": PREFIX + [40, 41, 42], "max_tokens": 3, "ignore_eos": True},  # hits the cached prefix
            {"prompt": [7, 8, 9], "max_tokens": 1, "ignore_eos": True},  # one token: no decode phase
        ]
        for body in bodies:  # one at a time: the second request finds the first one's blocks cached
            response = httpx.post(url, json=body, timeout=60)
            assert response.status_code == 200, response.text
        with httpx.stream("POST", url, timeout=60,
                          json={"prompt": [9, 10, 11, 12], "max_tokens": 3, "ignore_eos": True,
                                "stream": True}) as response:
            assert response.status_code == 200
            assert any("[DONE]" in line for line in response.iter_lines())
        bad = httpx.post(url, json={"prompt": [5, 6], "max_tokens": -1}, timeout=60)
        assert 400 <= bad.status_code < 500, bad.text
        # The streamed request's record is written when it ends, after its last chunk: poll (bounded)
        # until all four requests are counted, rather than sleeping.
        for _ in range(200):
            text = httpx.get(server.url + "/metrics", timeout=10).text
            families = {_family(f.name): f for f in text_string_to_metric_families(text)}
            samples = [(s.name, dict(s.labels), s.value) for f in families.values() for s in f.samples]
            if metric(samples, "vllm:request_success_total") >= 4:
                break
        return families, samples


@pytest.mark.parametrize("name", sorted(set(OVERVIEW) | set(OLDER)))
def test_every_dashboard_family_is_exposed(scrape, name):
    families, _ = scrape
    assert _family(name) in families, f"{name} is not on /metrics"
    wanted = (OVERVIEW.get(name) or OLDER[name])["type"]
    assert families[_family(name)].type == wanted, f"{name}: {families[_family(name)].type}, not {wanted}"


@pytest.mark.parametrize("name", sorted(set(OVERVIEW) | set(OLDER)))
def test_every_dashboard_label_is_exposed(scrape, name):
    families, _ = scrape
    spec = OVERVIEW.get(name) or OLDER[name]
    samples = families[_family(name)].samples
    assert samples, f"{name} has no samples"
    for label, values in spec["labels"].items():
        assert all(label in s.labels for s in samples), f"{name}: a sample lacks label {label!r}"
        if label == "reason" or label == "source":  # every value exists from the start (at 0)
            assert set(values) <= {s.labels[label] for s in samples}, f"{name}: {label} values {values}"


def test_counts_after_traffic(scrape):
    _, samples = scrape
    finished = 4  # three plain completions and the streamed one; the 4xx never reached the engine
    assert metric(samples, "vllm:request_success_total", finished_reason="length") == finished
    assert metric(samples, "vllm:request_success_total", finished_reason="error") == 0
    assert metric(samples, "vllm:request_success_total") == finished
    for phase in ("prefill", "decode"):
        assert metric(samples, f"vllm:request_{phase}_time_seconds_count") == finished
    assert metric(samples, "vllm:request_time_per_output_token_seconds_count") == finished
    assert metric(samples, "vllm:request_max_num_generation_tokens_sum") == 4 + 3 + 1 + 3
    assert metric(samples, "vllm:time_per_output_token_seconds_count") == \
        metric(samples, "vllm:inter_token_latency_seconds_count")

    # HTTP, as vLLM's instrumentator counts it: status classes, route templates, probes left out.
    assert metric(samples, "http_requests_total", handler="/v1/completions", status="2xx", method="POST") == 4
    assert metric(samples, "http_requests_total", handler="/v1/completions", status="4xx", method="POST") == 1
    assert metric(samples, "http_request_duration_seconds_count", handler="/v1/completions", method="POST") == 5
    assert metric(samples, "http_requests_total", handler="/metrics") == 0

    # Prompt tokens by source add up to the prompt tokens, and the shared prefix was a cache hit.
    prompt = metric(samples, "vllm:prompt_tokens_total")
    assert prompt == (len(PREFIX) + 2) + (len(PREFIX) + 3) + 3 + 4
    by_source = {source: metric(samples, "vllm:prompt_tokens_by_source_total", source=source)
                 for source in ("local_compute", "local_cache_hit", "external_kv_transfer")}
    assert sum(by_source.values()) == prompt
    assert by_source["local_cache_hit"] == metric(samples, "vllm:prefix_cache_hits_total") > 0
    assert by_source["external_kv_transfer"] == 0

    for name in ("vllm:external_prefix_cache_hits_total", "vllm:external_prefix_cache_queries_total",
                 "vllm:mm_cache_hits_total", "vllm:mm_cache_queries_total"):
        assert metric(samples, name) == 0, f"{name}: nothing here feeds it"
    assert metric(samples, "vllm:num_requests_waiting_by_reason") == metric(samples, "vllm:num_requests_waiting")
    assert metric(samples, "vllm:gpu_cache_usage_perc") == metric(samples, "vllm:kv_cache_usage_perc")
