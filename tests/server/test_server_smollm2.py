"""The server with no model configured: it serves the default SmolLM2-135M-Instruct (real text)."""

from __future__ import annotations

import pytest
from openai import OpenAI

from aioinfer import LLM, SamplingParams

pytestmark = pytest.mark.slow

MESSAGES = [[{"role": "user", "content": "请用中文介绍一下北京。"}],
            [{"role": "user", "content": "Write one line with emoji 🎉🚀 about the sea."}]]
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def server(smollm2_server):  # conftest.py: the default model, float32 on CPU
    return smollm2_server


@pytest.fixture(scope="module")
def llm(smollm2_gguf):
    return LLM(model=str(smollm2_gguf), dtype="float32", device="cpu", max_model_len=2048)


def test_default_model_matches_offline_and_streams_the_same(server, llm):
    client = OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    assert [m.id for m in client.models.list().data] == ["SmolLM2-135M-Instruct"]
    for messages in MESSAGES:
        want = llm.chat(messages, SamplingParams(temperature=0, max_tokens=24), use_tqdm=False)[0].outputs[0]
        args = dict(model="SmolLM2-135M-Instruct", messages=messages, max_tokens=24, temperature=0)
        full = client.chat.completions.create(**args).choices[0]
        streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **args)
                           if c.choices)
        assert full.message.content == want.text == streamed
        # The text is the whole output decoded at once (the detokenizer's byte-level table path).
        assert want.text == llm.get_tokenizer().decode(want.token_ids, skip_special_tokens=True)
        assert full.finish_reason == want.finish_reason
    want = llm.generate([PROMPT], SamplingParams(temperature=0.7, seed=4, max_tokens=16), use_tqdm=False)[0]
    got = client.completions.create(model="SmolLM2-135M-Instruct", prompt=PROMPT, max_tokens=16, temperature=0.7,
                                    seed=4)
    assert got.choices[0].text == want.outputs[0].text
