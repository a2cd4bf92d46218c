"""/metrics on a real server counts served work only, and counts it as vLLM does; it reports the KV
cache's settings (vllm:cache_config_info) as vLLM does too."""

from __future__ import annotations

import httpx
import pytest

from server_process import metric, metric_samples, run_server
from tiny_models import make_tiny_model_dir


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(make_tiny_model_dir(tmp_path_factory.mktemp("qwen2"), arch="qwen2"))


def test_a_fresh_server_counts_nothing_and_a_request_counts_prompt_plus_generated(model_dir, tmp_path):
    # A budget of 4 tokens a step prefills the 7-token prompt in two chunks: a prompt still counts once.
    # The KV cache and the weights in fp8, set by their variables: reported as vLLM reports the cache
    # (and in /v1/models), counts unchanged.
    env = {"AIOINFER_MODEL": model_dir, "AIOINFER_DEVICE": "cpu", "AIOINFER_DTYPE": "float32",
           "AIOINFER_MAX_NUM_BATCHED_TOKENS": "4", "AIOINFER_NUM_KV_BLOCKS": "64", "AIOINFER_KV_CACHE_DTYPE": "fp8",
           "AIOINFER_QUANTIZATION": "fp8"}
    with run_server(env, tmp_path) as server:
        card = httpx.get(server.url + "/v1/models").json()["data"][0]
        assert card["quantization"] == "fp8" and card["kv_cache_dtype"] == "fp8"
        fresh = metric_samples(server)
        assert metric(fresh, "vllm:cache_config_info", cache_dtype="fp8", num_gpu_blocks="64", engine="0") == 1
        for name in ("vllm:request_success_total", "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
                     "vllm:iteration_tokens_total_count", "vllm:e2e_request_latency_seconds_count"):
            assert metric(fresh, name) == 0, f"{name}: the warm-up request is not served work"

        prompt, generated = [5, 6, 7, 8, 9, 10, 11], 5
        response = httpx.post(server.url + "/v1/completions", timeout=60,
                              json={"prompt": prompt, "max_tokens": generated, "ignore_eos": True})
        assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == generated
        after = metric_samples(server)
        assert metric(after, "vllm:request_success_total", finished_reason="length") == 1
        assert metric(after, "vllm:prompt_tokens_total") == len(prompt)
        assert metric(after, "vllm:generation_tokens_total") == generated
        # vLLM's iteration tokens: P + G over the request's steps (the computed tokens are P + G - 1).
        assert metric(after, "vllm:iteration_tokens_total_sum") == len(prompt) + generated
