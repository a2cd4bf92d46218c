"""vLLM's ``vllm:cache_config_info`` gauge: the async Engine reports its cache's settings once loaded
(``stats()["cache_config"]``), and the server's recorder exposes them at scrape time, ``cache_dtype``
as vLLM spells it ("auto" or the fp8 name given), one series per data-parallel replica."""

from __future__ import annotations

import pytest

from aioinfer import Engine, SamplingParams
from aioinfer.metrics import PrometheusMetrics
from aioinfer.metrics_reader import Gauge, read_metrics
from tiny_models import make_tiny_model_dir


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(make_tiny_model_dir(tmp_path_factory.mktemp("qwen2"), arch="qwen2"))


def _info(metrics: PrometheusMetrics) -> list[Gauge]:
    return [m for m in read_metrics(metrics.registry) if m.name == "vllm:cache_config_info"]


@pytest.mark.anyio
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
async def test_the_engine_reports_its_cache_and_the_gauge_shows_it(model_dir, kv_cache_dtype):
    async with Engine(model_dir, dtype="float32", device="cpu", block_size=8, num_kv_blocks=40,
                      kv_cache_dtype=kv_cache_dtype) as engine:
        async for _ in engine.generate([5, 6, 7], SamplingParams(max_tokens=3, temperature=0)):
            pass
        stats = engine.stats()
    info = stats["cache_config"]
    assert info["cache_dtype"] == kv_cache_dtype and info["num_gpu_blocks"] == "40" and info["block_size"] == "8"
    assert info["num_cpu_blocks"] == "0" and info["enable_prefix_caching"] == "True"
    metrics = PrometheusMetrics("tiny")
    assert _info(metrics) == []  # nothing before the engine has loaded
    metrics.refresh(stats)
    metrics.refresh(stats)  # every scrape refreshes: still one series
    (gauge,) = _info(metrics)
    assert gauge.value == 1 and gauge.labels == {**info, "engine": "0"}
    assert f'cache_dtype="{kv_cache_dtype}"' in metrics.render().decode()


def test_one_series_per_replica():
    metrics = PrometheusMetrics("tiny")
    replica = {"num_running": 0, "num_waiting": 0, "kv_usage": 0.0}
    info = {"block_size": "16", "cache_dtype": "fp8", "num_gpu_blocks": "100"}
    metrics.refresh({"replicas": [{**replica, "cache_config": info},
                                  {**replica, "cache_config": {**info, "num_gpu_blocks": "90"}}]})
    got = {g.labels["engine"]: g.labels["num_gpu_blocks"] for g in _info(metrics)}
    assert got == {"0": "100", "1": "90"}
    metrics.refresh({"replicas": [{**replica, "cache_config": {**info, "num_gpu_blocks": "80"}}, replica]})
    got = {g.labels["engine"]: g.labels["num_gpu_blocks"] for g in _info(metrics)}
    assert got == {"0": "80", "1": "90"}  # a changed pool replaces its series; no report keeps the last
