"""The AsyncLLM facade as vLLM's async streaming example uses it (AsyncLLM.from_engine_args, generate
with DELTA / CUMULATIVE / FINAL_ONLY outputs, shutdown() in a finally, no ``async with``), on the real
engine: the texts equal the offline LLM's, and the engine's thread is gone once the loop ends."""

from __future__ import annotations

import asyncio
import threading

import pytest

from aioinfer import LLM, SamplingParams
from aioinfer.async_llm import AsyncEngineArgs, AsyncLLM
from aioinfer.sampling_params import RequestOutputKind
from tiny_models import make_tiny_model_dir

OPTIONS = dict(device="cpu", dtype="float32", max_model_len=128, num_kv_blocks=32, enforce_eager=True)
PROMPTS = ["The future of AI is", "Hello, my name is"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(make_tiny_model_dir(tmp_path_factory.mktemp("qwen2"), arch="qwen2"))


def _gpu_threads() -> list[str]:
    """The engines' GPU threads still running. The loop's end cancels the engine's task, which
    stops its thread first thing (Engine.__aexit__), so any left finish soon: joined here, with a
    bound far above a step's time so that a loaded machine cannot fail this."""
    for thread in [t for t in threading.enumerate() if t.name == "aioinfer-gpu"]:
        thread.join(timeout=60)
    return [t.name for t in threading.enumerate() if t.name == "aioinfer-gpu"]


def test_vllm_async_streaming_example(model_dir):
    want = [o.outputs[0] for o in LLM(model=model_dir, **OPTIONS).generate(
        PROMPTS, SamplingParams(max_tokens=12, temperature=0), use_tqdm=False)]
    seen: dict[str, list] = {}

    async def stream_response(engine: AsyncLLM, prompt: str, request_id: str, kind) -> None:
        params = SamplingParams(max_tokens=12, temperature=0, output_kind=kind)
        outputs = seen.setdefault(f"{request_id}", [])
        async for output in engine.generate(request_id=request_id, prompt=prompt, sampling_params=params):
            outputs.append(output)
            if output.finished:
                break

    async def main() -> None:
        engine = AsyncLLM.from_engine_args(AsyncEngineArgs(model=model_dir, **OPTIONS))
        try:
            for i, prompt in enumerate(PROMPTS):
                for kind in RequestOutputKind:
                    await stream_response(engine, prompt, f"stream-{i}-{kind.name}", kind)
        finally:
            engine.shutdown()

    asyncio.run(main())
    assert _gpu_threads() == []  # shutdown() and the loop's end stopped the engine
    for i, expected in enumerate(want):
        cumulative, delta, final = (seen[f"stream-{i}-{kind.name}"] for kind in RequestOutputKind)
        assert "".join(o.outputs[0].text for o in delta) == expected.text
        assert [t for o in delta for t in o.outputs[0].token_ids] == list(expected.token_ids)
        assert cumulative[-1].outputs[0].text == expected.text and len(cumulative) > 1
        assert [len(o.outputs[0].token_ids) for o in cumulative] == sorted(len(o.outputs[0].token_ids) for o in cumulative)
        assert len(final) == 1 and final[0].finished and final[0].outputs[0].token_ids == list(expected.token_ids)
        assert final[0].prompt == PROMPTS[i] and final[0].outputs[0].finish_reason == "length"


def test_async_with_and_concurrent_requests(model_dir):
    async def main() -> list[str]:
        async with AsyncLLM(model_dir, **OPTIONS) as engine:
            async def one(i: int) -> str:
                last = None
                async for last in engine.generate({"prompt": PROMPTS[i]}, SamplingParams(max_tokens=8, temperature=0),
                                                  request_id=f"r{i}"):
                    pass
                return last.outputs[0].text
            texts = await asyncio.gather(*(one(i) for i in range(len(PROMPTS))))
            with pytest.raises(ValueError, match="n must be 1"):
                async for _ in engine.generate("x", SamplingParams(n=2)):
                    pass
            return texts
        # leaving the block waited for the engine to stop

    texts = asyncio.run(main())
    assert _gpu_threads() == []
    offline = LLM(model=model_dir, **OPTIONS).generate(PROMPTS, SamplingParams(max_tokens=8, temperature=0),
                                                       use_tqdm=False)
    assert texts == [o.outputs[0].text for o in offline]


def test_bad_options_fail_at_construction(model_dir):
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        AsyncLLM(model_dir, kv_cache_dtype="fp8_e5m2")
    with pytest.raises(ValueError, match="output_kind"):
        SamplingParams(output_kind=7)


def test_prompt_logprobs_come_with_the_outputs(model_dir):
    """``prompt_logprobs``: the offline LLM's rows, on the DELTA output that brings the first token
    (and no later one), and on every CUMULATIVE and FINAL_ONLY output."""
    params = dict(max_tokens=4, temperature=0, prompt_logprobs=2)
    want = LLM(model=model_dir, **OPTIONS).generate(PROMPTS[:1], SamplingParams(**params), use_tqdm=False)[0]
    assert want.prompt_logprobs is not None and want.prompt_logprobs[0] is None

    async def main() -> dict:
        seen = {}
        async with AsyncLLM(model=model_dir, **OPTIONS) as engine:
            for kind in RequestOutputKind:
                seen[kind] = [o async for o in engine.generate(PROMPTS[0], SamplingParams(output_kind=kind, **params),
                                                               request_id=f"p-{kind.name}")]
        return seen

    seen = asyncio.run(main())
    delta = seen[RequestOutputKind.DELTA]
    assert delta[0].prompt_logprobs == want.prompt_logprobs and all(o.prompt_logprobs is None for o in delta[1:])
    for kind in (RequestOutputKind.CUMULATIVE, RequestOutputKind.FINAL_ONLY):
        assert all(o.prompt_logprobs == want.prompt_logprobs for o in seen[kind]), kind
