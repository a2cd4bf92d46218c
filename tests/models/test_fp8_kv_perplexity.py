"""An fp8 KV cache keeps a real model's quality: perplexity on a fixed English text within 2 % of the
cache in the model's dtype (SmolLM2-135M-Instruct and Qwen2.5-Coder-0.5B-Instruct GGUFs, float32 on CPU;
the GPU variant: bfloat16 on the Triton kernels, with CUDA graphs).
Measured on CPU: SmolLM2 24.2701 -> 24.4082 (x1.0057), Qwen2.5-Coder 37.6002 -> 38.0921 (x1.0131);
the test prints both figures of each run.

Perplexity comes from the engine's prompt logprobs (each token's logprob given the text before it,
every position but the first). Attention reads every context token's K and V back from the cache (its
own chunk's too: they are written before attention), so every position sees the fp8 rounding; the
text goes through in chunks of 64 tokens, as a long prompt does in a busy server. No calibrated
scales: these checkpoints carry none, so the cache uses vLLM's default scale of 1.0.
"""

from __future__ import annotations

import math

import pytest

from aioinfer import LLM, SamplingParams

pytestmark = pytest.mark.slow

TEXT = (
    "The lighthouse keeper woke before dawn, as he had every morning for thirty years. He climbed the spiral "
    "stairs, counted the one hundred and twelve steps out of habit, and checked the lamp, the lenses and the "
    "small brass clock that had never once been wrong. Outside, the sea was grey and calm, and a line of "
    "fishing boats was already leaving the harbour. He wrote the weather in his log: wind from the west, "
    "light rain expected by noon, visibility good. Then he made tea and sat by the window to watch the boats "
    "grow smaller. His daughter had written to say that the lighthouse would be automated next spring, and "
    "that he should think about moving to the city, where she lived with her two children. He had read the "
    "letter many times. In the city there would be noise and traffic and people everywhere, but there would "
    "also be his grandchildren, who asked him questions about ships and storms and the stars he used to "
    "navigate by. He thought about the long winter nights, when the wind shook the tower and the light swept "
    "across the black water, and about the summer evenings, when tourists came to take photographs and ask "
    "whether he was ever lonely. He always told them the truth: sometimes, but not often, because the sea "
    "was never the same two days in a row. When the tea was finished, he took out a sheet of paper and began "
    "a reply. He wrote that he would come in the spring, that he would bring the brass clock, and that he "
    "hoped there would be a window from which he could see at least a little of the sky."
)
MAX_RATIO_CHANGE = 0.02  # the bound: fp8 perplexity within 2 % of the model dtype's
CHUNK = 64  # tokens per step: the text is prefilled in chunks that read the earlier ones from the cache


def perplexity(llm: LLM, token_ids: list[int]) -> float:
    out = llm.generate([token_ids], SamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False)[0]
    logprobs = [entry[token].logprob for entry, token in zip(out.prompt_logprobs[1:], token_ids[1:])]
    return math.exp(-sum(logprobs) / len(logprobs))


def _compare(model_path, **options) -> tuple[float, float]:
    ppl, tokens = {}, None
    for kv in ("auto", "fp8"):
        llm = LLM(model=str(model_path), kv_cache_dtype=kv, max_num_batched_tokens=CHUNK, max_model_len=2048,
                  num_kv_blocks=256, enable_prefix_caching=False, **options)
        if tokens is None:
            tokens = llm.get_tokenizer()(TEXT).input_ids
            assert 250 <= len(tokens) <= 600, len(tokens)
        ppl[kv] = perplexity(llm, tokens)
        assert llm.engine.kv_cache.all_free()
        del llm
    print(f"{model_path.name}: perplexity over {len(tokens)} tokens: auto KV {ppl['auto']:.4f}, "
          f"fp8 KV {ppl['fp8']:.4f}, ratio {ppl['fp8'] / ppl['auto']:.4f}")
    return ppl["auto"], ppl["fp8"]


@pytest.fixture(scope="module", params=["smollm2", "qwen25_coder"])
def gguf(request):
    return request.getfixturevalue("smollm2_gguf" if request.param == "smollm2" else "qwen25_coder_gguf")


def test_fp8_kv_perplexity_within_two_percent(gguf):
    auto, fp8 = _compare(gguf, dtype="float32", device="cpu")
    assert 1.0 < auto < 100  # a model that reads the text at all
    assert abs(fp8 / auto - 1) <= MAX_RATIO_CHANGE, (auto, fp8)


@pytest.mark.gpu
def test_gpu_fp8_kv_perplexity_within_two_percent(gguf):
    """bfloat16 weights on the Triton kernels (the auto backend on CUDA), the 64-token prefill chunks
    replayed from CUDA graphs."""
    auto, fp8 = _compare(gguf, dtype="bfloat16", device="cuda")
    assert abs(fp8 / auto - 1) <= MAX_RATIO_CHANGE, (auto, fp8)
