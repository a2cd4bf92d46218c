"""Speculative decoding on CUDA: drafts verified with async scheduling and CUDA graphs (or eager)."""

from __future__ import annotations

import random

import pytest

from aioinfer import LLM, SamplingParams
from spec_oracle import install_oracle
from tiny_models import make_tiny_model_dir

pytestmark = pytest.mark.gpu
SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1}


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def tiny(request, tmp_path_factory):
    path = make_tiny_model_dir(tmp_path_factory.mktemp(request.param), arch=request.param)
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 400) for _ in range(n)] for n in (5, 17, 33, 40, 64, 3, 70, 21)]
    return path, prompts + [prompts[2]]


@pytest.mark.parametrize("eager", [False, True])
def test_gpu_greedy_identical_with_drafts(tiny, monkeypatch, eager):
    """On CUDA: async scheduling on by default, drafts verified through the captured token graphs
    (or eager), outputs equal to the same engine without speculation."""
    path, prompts = tiny
    options = dict(device="cuda", dtype="float32", enforce_eager=eager, gpu_memory_utilization=0.3)
    off_llm = LLM(model=str(path), **options)
    off = _greedy(off_llm, prompts)
    del off_llm
    install_oracle(monkeypatch, {tuple(p): r for p, r in zip(prompts, off)})
    llm = LLM(model=str(path), speculative_config=SPEC, **options)
    assert _greedy(llm, prompts) == off
    assert _greedy(llm, prompts[:1]) == off[:1]  # batch 1
    assert 0 < _policy(llm).num_accepted_tokens < _policy(llm).num_draft_tokens


def _greedy(llm: LLM, prompts) -> list[list[int]]:
    sp = SamplingParams(temperature=0.0, max_tokens=24)
    return [o.outputs[0].token_ids for o in llm.generate(prompts, sp, use_tqdm=False)]


def _policy(llm: LLM):
    return llm.engine.scheduler.draft_policy
