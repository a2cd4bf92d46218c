"""Data parallelism on two GPUs (marked gpu; skipped with fewer than two): each replica keeps all of
its work on its own device, with CUDA graphs, and gives the offline LLM's greedy tokens."""

from __future__ import annotations

import random

import pytest
import torch

from aioinfer import LLM, DataParallelEngine, SamplingParams
from engine_streams import generate_all
from tiny_models import make_tiny_model_dir

pytestmark = pytest.mark.gpu

OPTIONS = dict(dtype="float32", attention_backend="triton", max_num_batched_tokens=128, block_size=16,
               num_kv_blocks=256)


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.mark.anyio
async def test_two_replicas_on_two_gpus_equal_the_offline_llm(tmp_path):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices")
    path = str(make_tiny_model_dir(tmp_path, arch="qwen2"))
    rng = random.Random(0)
    prompts = [[rng.randrange(400) for _ in range(rng.choice([1, 5, 16, 17, 40, 100]))] for _ in range(24)]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    expected = [o.outputs[0].token_ids
                for o in LLM(model=path, device="cuda:0", **OPTIONS).generate(prompts, params, use_tqdm=False)]
    async with DataParallelEngine(path, data_parallel_size=2, device="cuda", **OPTIONS) as engine:
        first, second = engine.replicas
        assert [r.config.device for r in engine.replicas] == ["cuda:0", "cuda:1"]
        assert first._core.executor.runner.graphs is not None and second._core.executor.runner.graphs is not None
        assert {p.device for p in second._core.loaded.model.parameters()} == {torch.device("cuda:1")}
        assert all(k.device == torch.device("cuda:1") for k, _ in second._core.executor.runner.kv_caches)
        results = await generate_all(engine, prompts, params)
        routed = [s["routed"] for s in engine.stats()["replicas"]]
    assert results == expected
    assert min(routed) > 0, routed
