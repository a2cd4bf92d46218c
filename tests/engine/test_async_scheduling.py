"""Async scheduling (step N+1 launched before step N's sampled ids reach the host) changes nothing
observable: the same tokens as the synchronous loop and as transformers, on every scheduler path."""

from __future__ import annotations

import pytest

from aioinfer import LLM, SamplingParams
from test_llm_equivalence import MAX_TOKENS, tiny  # noqa: F401  (module fixture: model + HF reference)
from tiny_models import make_tiny_model_dir


def _run(path, prompts, params, **kwargs):
    llm = LLM(model=str(path), dtype="float32", device="cpu", async_scheduling=True, **kwargs)
    assert llm.engine.async_scheduling
    outputs = llm.generate(prompts, params, use_tqdm=False)
    return llm, [o.outputs[0] for o in outputs]


@pytest.mark.parametrize("options", [
    {},
    {"max_num_batched_tokens": 24},  # chunked prefill
    {"block_size": 4, "max_num_batched_tokens": 64},
    {"block_size": 8, "num_kv_blocks": 15, "max_num_batched_tokens": 48},  # preemption
    {"max_num_seqs": 3},
])
def test_greedy_matches_transformers(tiny, options):  # noqa: F811
    _, path, prompts, expected = tiny
    llm, outs = _run(path, prompts, SamplingParams(temperature=0, max_tokens=MAX_TOKENS), **options)
    assert [o.token_ids for o in outs] == expected
    if "num_kv_blocks" in options:
        assert llm.engine.scheduler.num_preemptions > 0
    assert not llm.engine.has_unfinished() and llm.engine.kv_cache.all_free()


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory):
    return make_tiny_model_dir(tmp_path_factory.mktemp("qwen2-async"), arch="qwen2")


PROMPTS = [[5, 9, 13, 200, 7], [42] * 3, list(range(30, 70)), [311, 17], [99, 98, 97, 96, 95, 94, 93]]


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.9, top_p=0.9, seed=3, max_tokens=20, ignore_eos=True),
    SamplingParams(temperature=0.8, min_p=0.05, max_tokens=15, min_tokens=5),
    SamplingParams(temperature=0.7, seed=1, max_tokens=12, presence_penalty=0.5, repetition_penalty=1.2),
    SamplingParams(temperature=0, max_tokens=10, logprobs=2),
    SamplingParams(n=3, temperature=1.0, seed=9, max_tokens=8),
])
def test_same_outputs_as_the_synchronous_loop(qwen_dir, params):
    sync = LLM(model=str(qwen_dir), dtype="float32", device="cpu", async_scheduling=False,
               block_size=4, num_kv_blocks=30, max_num_batched_tokens=32)
    want = sync.generate(PROMPTS, params, use_tqdm=False)
    asyn = LLM(model=str(qwen_dir), dtype="float32", device="cpu", async_scheduling=True,
               block_size=4, num_kv_blocks=30, max_num_batched_tokens=32)
    got = asyn.generate(PROMPTS, params, use_tqdm=False)
    for w, g in zip(want, got):
        for wc, gc in zip(w.outputs, g.outputs):
            assert (gc.token_ids, gc.text, gc.finish_reason) == (wc.token_ids, wc.text, wc.finish_reason)
            if params.logprobs is not None:
                assert [sorted(d) for d in gc.logprobs] == [sorted(d) for d in wc.logprobs]



def test_a_request_with_penalties_joins_a_batch_scheduled_ahead(qwen_dir):
    """A request with penalties added while a step is in flight (a server's, any time) is admitted into
    the step scheduled ahead, beside rows whose tokens are still on the device: the same tokens as each
    alone in the synchronous loop. (This stopped the step loop: the penalties' check covered every
    row of the step, not only the rows with a penalty.)"""
    plain = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    penalized = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, repetition_penalty=1.3,
                               presence_penalty=0.5, frequency_penalty=0.2)
    sync = LLM(model=str(qwen_dir), dtype="float32", device="cpu", async_scheduling=False)
    want = {"a": sync.generate([PROMPTS[0]], plain, use_tqdm=False)[0].outputs[0].token_ids,
            "b": sync.generate([PROMPTS[1]], penalized, use_tqdm=False)[0].outputs[0].token_ids}
    llm = LLM(model=str(qwen_dir), dtype="float32", device="cpu", async_scheduling=True)
    core, got = llm.engine, {"a": [], "b": []}

    def step():
        for out in core.step():
            got[out.request_id] += out.new_token_ids

    core.add_request(llm.inputs.make_request("a", PROMPTS[0], plain.clone()))
    step()
    step()
    assert core._in_flight is not None  # a step of "a" launched ahead, its token not yet on the host
    core.add_request(llm.inputs.make_request("b", PROMPTS[1], penalized.clone()))
    while core.has_unfinished():
        step()
    assert got == want
    assert core.kv_cache.all_free()

def test_eos_and_stop_strings_end_requests_a_step_late_without_extra_tokens(qwen_dir):
    llm = LLM(model=str(qwen_dir), dtype="float32", device="cpu", async_scheduling=True)
    eos = llm.engine.loaded.eos_token_ids[0]
    out = llm.generate([PROMPTS[0]], SamplingParams(temperature=0, logit_bias={eos: 100.0}, max_tokens=10),
                       use_tqdm=False)[0].outputs[0]
    assert out.token_ids == [eos] and out.finish_reason == "stop"
    full = llm.generate(["Hello world"], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True),
                        use_tqdm=False)[0].outputs[0]
    stop = full.text[3:6]
    out = llm.generate(["Hello world"], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, stop=[stop]),
                       use_tqdm=False)[0].outputs[0]
    assert out.text == full.text[:full.text.index(stop)] and out.finish_reason == "stop"
    assert not llm.engine.has_unfinished() and llm.engine.kv_cache.all_free()


def test_async_engine_with_async_scheduling(qwen_dir):
    import anyio

    from aioinfer import Engine

    sync = LLM(model=str(qwen_dir), dtype="float32", device="cpu")
    params = SamplingParams(temperature=0.8, seed=4, max_tokens=16, ignore_eos=True)
    want = [o.outputs[0].token_ids for o in sync.generate(PROMPTS, params, use_tqdm=False)]

    async def main():
        got = {}
        async with Engine(str(qwen_dir), dtype="float32", device="cpu", async_scheduling=True) as engine:
            async def one(i):
                ids = []
                async for delta in engine.generate(PROMPTS[i], params):
                    ids += delta.token_ids
                got[i] = ids

            async with anyio.create_task_group() as tg:
                for i in range(len(PROMPTS)):
                    tg.start_soon(one, i)
            # leave one request mid-stream: shutdown must drain the step launched ahead
            stream = engine.generate(PROMPTS[2], SamplingParams(temperature=0, max_tokens=300, ignore_eos=True))
            await stream.__anext__()
        return [got[i] for i in range(len(PROMPTS))]

    assert anyio.run(main) == want
