"""vLLM's prompt dicts (TextPrompt, TokensPrompt) offline and on the asyncio Engine: the same outputs
as the plain string / id list, a dict's cache_salt used, bad dicts a ValueError naming the problem."""

from __future__ import annotations

import anyio
import pytest

from aioinfer import LLM, SamplingParams
from aioinfer.inputs import TextPrompt, TokensPrompt

GREEDY = SamplingParams(temperature=0, max_tokens=6)


@pytest.fixture(scope="module")
def llm(smollm2_gguf):
    return LLM(model=str(smollm2_gguf), dtype="float32", device="cpu", max_model_len=512)


def _ids(outputs):
    return [o.outputs[0].token_ids for o in outputs]


def test_dicts_give_the_same_outputs_as_plain_prompts(llm):
    text = "The capital of France is"
    ids = llm.get_tokenizer().encode(text)
    plain = _ids(llm.generate([text, ids], GREEDY, use_tqdm=False))
    assert _ids(llm.generate([{"prompt": text}, {"prompt_token_ids": ids}], GREEDY, use_tqdm=False)) == plain
    assert _ids(llm.generate([TextPrompt(prompt=text), TokensPrompt(prompt_token_ids=ids)], GREEDY,
                             use_tqdm=False)) == plain
    # One dict alone is one prompt (vLLM's llm.generate({"prompt_token_ids": ids})).
    single = llm.generate(TokensPrompt(prompt_token_ids=ids, prompt=text), GREEDY, use_tqdm=False)
    assert _ids(single) == plain[1:] and single[0].prompt == text and single[0].prompt_token_ids == ids


def test_a_dicts_cache_salt_separates_prefix_blocks(llm):
    ids = llm.get_tokenizer().encode("A fairly long shared prefix, " * 8)
    llm.generate([{"prompt_token_ids": ids, "cache_salt": "tenant-a"}], GREEDY, use_tqdm=False)
    out_b = llm.generate([{"prompt_token_ids": ids, "cache_salt": "tenant-b"}], GREEDY, use_tqdm=False)[0]
    out_a = llm.generate([{"prompt_token_ids": ids, "cache_salt": "tenant-a"}], GREEDY, use_tqdm=False)[0]
    assert out_b.num_cached_tokens == 0  # another tenant's blocks are not shared
    assert out_a.num_cached_tokens > 0  # its own are
    with pytest.raises(ValueError, match="cache_salt"):
        llm.generate({"prompt_token_ids": ids, "cache_salt": "x"}, GREEDY, cache_salt="y", use_tqdm=False)


@pytest.mark.parametrize("prompt, message", [
    ({"prompt_token_ids": [1, 2], "multi_modal_data": {"image": None}}, "multi_modal_data"),
    ({"prompt": "hi", "stream": True}, "unknown prompt fields \\['stream'\\]"),
    ({"text": "hi"}, "needs 'prompt' or 'prompt_token_ids'"),
    ({"prompt": ["hi"]}, "must be a string"),
    ({"prompt_token_ids": "1 2 3"}, "list of token ids"),
    ({"prompt_token_ids": [1, -5]}, "token ids must be in"),
    ({"prompt": "hi", "cache_salt": ""}, "cache_salt"),
])
def test_bad_dicts_are_value_errors_and_queue_nothing(llm, prompt, message):
    with pytest.raises(ValueError, match=message):
        llm.generate(["fine", prompt], GREEDY, use_tqdm=False)
    assert not llm.engine.scheduler.has_unfinished()


def test_engine_takes_prompt_dicts(smollm2_gguf, llm):
    from aioinfer import Engine

    ids = llm.get_tokenizer().encode("Once upon a time")
    expected = _ids(llm.generate([ids], GREEDY, use_tqdm=False))[0]

    async def main():
        async with Engine(str(smollm2_gguf), dtype="float32", device="cpu", max_model_len=512) as engine:
            got = []
            async for delta in engine.generate(TokensPrompt(prompt_token_ids=ids, cache_salt="s"), GREEDY):
                got += delta.token_ids
            return got

    assert anyio.run(main) == expected
