"""Greedy outputs of the offline LLM are token-identical to transformers' generate, on every scheduler path."""

from __future__ import annotations

import random

import pytest
import torch

from aioinfer import LLM, SamplingParams
from tiny_models import make_tiny_model_dir

MAX_TOKENS = 12
NUM_PROMPTS = 18


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def tiny(request, tmp_path_factory):
    """(arch, model dir, prompts as token-id lists, transformers' greedy continuation of each)."""
    from transformers import AutoModelForCausalLM

    arch = request.param
    path = make_tiny_model_dir(tmp_path_factory.mktemp(arch), arch=arch)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    rng = random.Random(0)
    vocab = hf.config.vocab_size
    lengths = [1, 2, 3, 5, 8, 13, 15, 16, 17, 21, 31, 32, 33, 40, 47, 55, 64, 70][:NUM_PROMPTS]
    rng.shuffle(lengths)
    prompts = [[rng.randrange(vocab) for _ in range(n)] for n in lengths]
    expected = []
    with torch.no_grad():
        for prompt in prompts:
            out = hf.generate(torch.tensor([prompt]), max_new_tokens=MAX_TOKENS, do_sample=False,
                              attention_mask=torch.ones(1, len(prompt), dtype=torch.long))
            expected.append(out[0, len(prompt):].tolist())
    return arch, path, prompts, expected


def _generate(llm: LLM, prompts) -> list[list[int]]:
    outputs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS), use_tqdm=False)
    return [o.outputs[0].token_ids for o in outputs]


def _llm(path, **kwargs) -> LLM:
    return LLM(model=str(path), dtype="float32", device="cpu", **kwargs)


def _assert_same(got, expected):
    for i, (g, e) in enumerate(zip(got, expected)):
        assert g == e, f"prompt {i}: engine {g} != transformers {e}"
    assert len(got) == len(expected)


def test_default_batch_matches_transformers(tiny):
    _, path, prompts, expected = tiny
    llm = _llm(path)
    _assert_same(_generate(llm, prompts), expected)


def test_chunked_prefill_matches_transformers(tiny):
    _, path, prompts, expected = tiny
    llm = _llm(path, max_num_batched_tokens=24)  # below the longest prompt (70 tokens)
    steps_before = llm.engine.num_steps
    _assert_same(_generate(llm, prompts), expected)
    assert llm.engine.num_steps - steps_before > MAX_TOKENS + 70 // 24  # prompts really were split


@pytest.mark.parametrize("block_size", [1, 4, 32])
def test_block_sizes_match_transformers(tiny, block_size):
    _, path, prompts, expected = tiny
    llm = _llm(path, block_size=block_size, max_num_batched_tokens=64)
    _assert_same(_generate(llm, prompts), expected)


def test_preemption_matches_transformers(tiny):
    _, path, prompts, expected = tiny
    # 14 usable blocks of 8 tokens: enough for the longest request alone, far too few for all of them.
    llm = _llm(path, block_size=8, num_kv_blocks=15, max_num_batched_tokens=48)
    _assert_same(_generate(llm, prompts), expected)
    assert llm.engine.scheduler.num_preemptions > 0


def test_each_prompt_alone_equals_batch(tiny):
    _, path, prompts, expected = tiny
    llm = _llm(path)
    batch = _generate(llm, prompts)
    alone = [_generate(llm, [p])[0] for p in prompts]
    assert alone == batch
    _assert_same(batch, expected)


def test_text_prompts_and_output_fields(tiny):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _, path, _, _ = tiny
    tok = AutoTokenizer.from_pretrained(path)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    llm = _llm(path)
    texts = ["Hello world", "今天天气很好", "emoji 🎉 time", " leading space"]
    outputs = llm.generate(texts, SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
    for text, out in zip(texts, outputs):
        ids = tok(text).input_ids
        assert out.prompt == text and out.prompt_token_ids == ids
        ref = hf.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False,
                          attention_mask=torch.ones(1, len(ids), dtype=torch.long))[0, len(ids):].tolist()
        completion = out.outputs[0]
        assert completion.token_ids == ref
        assert completion.text == tok.decode(ref, skip_special_tokens=True)
        assert completion.finish_reason in ("stop", "length")
