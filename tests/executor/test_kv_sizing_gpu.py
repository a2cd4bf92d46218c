"""Sizing the KV cache on CUDA: memory an earlier engine (or anything else) left behind in this
process counts as free. On an 80 GB card the GPU suites failed on their second engine otherwise:
the first one's pool sat in reference cycles or torch's cache, and mem_get_info counted it as used."""

from __future__ import annotations

import pytest
import torch

from aioinfer import LLM, SamplingParams
from tiny_models import make_tiny_model_dir

pytestmark = pytest.mark.gpu


def test_memory_left_in_cycles_and_torch_cache_counts_as_free(tmp_path_factory):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    utilization = 0.3
    free, total = torch.cuda.mem_get_info()
    # Take all the card this engine may have, and drop it where only the cycle collector frees it;
    # even once collected, torch keeps the block cached and the driver still counts it as used.
    hog = torch.empty(int(free - total * (1 - utilization)), dtype=torch.uint8, device="cuda")
    cycle: list = [hog]
    cycle.append(cycle)
    del hog, cycle
    folder = make_tiny_model_dir(tmp_path_factory.mktemp("tiny"), "qwen2")
    llm = LLM(model=str(folder), device="cuda", dtype="bfloat16", gpu_memory_utilization=utilization, max_model_len=256)
    assert llm.engine.executor.runner.num_kv_blocks >= 2
    output = llm.generate([[3, 5, 7]], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)[0]
    assert len(output.outputs[0].token_ids) == 4
