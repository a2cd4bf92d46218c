"""Chat content as a list of parts: one normalization (chat_content) for the server and LLM.chat.

The LLM.chat tests run on the real SmolLM2-135M-Instruct (its own chat template, real tokenizer).
"""

from __future__ import annotations

import pytest

from aioinfer import LLM, SamplingParams
from aioinfer.entrypoints.chat_content import UnsupportedContentPart, content_text
from aioinfer.entrypoints.openai.errors import APIError
from aioinfer.entrypoints.openai.protocol import ChatCompletionRequest
from aioinfer.entrypoints.openai.serving_common import parse_body

PARTS = [{"type": "text", "text": "Name a colour."}, {"type": "text", "text": "Answer in one word."}]
JOINED = "Name a colour.\nAnswer in one word."  # vLLM's join


def test_content_text_forms():
    assert content_text("plain") == "plain"
    assert content_text(None) is None
    assert content_text(PARTS) == JOINED
    assert content_text([]) == ""
    with pytest.raises(UnsupportedContentPart, match="'image_url'.*text only") as info:
        content_text([PARTS[0], {"type": "image_url", "image_url": {"url": "x"}}], "message 3, ")
    assert info.value.part_type == "image_url" and str(info.value).startswith("message 3, content part 1: ")
    for bad, match in [([{"text": "no type"}], "'type'"), ([{"type": "text", "text": 5}], "string 'text'"),
                       (["bare"], "'type'"), ({"type": "text"}, "string or a list")]:
        with pytest.raises(ValueError, match=match):
            content_text(bad)


def test_server_parses_parts_with_the_same_rule():
    body = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": PARTS}]})
    assert body.messages[0].for_template() == {"role": "user", "content": JOINED}
    with pytest.raises(APIError) as info:
        parse_body(ChatCompletionRequest, b'{"messages": [{"role": "user", "content": '
                                          b'[{"type": "input_audio", "input_audio": {}}]}]}')
    assert info.value.status == 400 and info.value.param == "messages.0.content.0"
    assert "'input_audio'" in info.value.message and "text only" in info.value.message


@pytest.fixture(scope="module")
def llm(smollm2_gguf):
    return LLM(model=str(smollm2_gguf), dtype="float32", device="cpu", max_model_len=512)


@pytest.mark.slow
def test_llm_chat_list_content_equals_string_content(llm):
    params = SamplingParams(temperature=0, max_tokens=12)
    as_parts = [{"role": "system", "content": [{"type": "text", "text": "You are terse."}]},
                {"role": "user", "content": PARTS}]
    as_string = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": JOINED}]
    got, want = llm.chat([as_parts, as_string], params, use_tqdm=False)
    assert got.prompt == want.prompt and got.prompt_token_ids == want.prompt_token_ids
    assert got.outputs[0].text == want.outputs[0].text and got.outputs[0].token_ids == want.outputs[0].token_ids
    assert as_parts[1]["content"] is PARTS  # the caller's messages are left as they were


@pytest.mark.slow
@pytest.mark.parametrize("part_type", ["image_url", "input_audio", "file"])
def test_llm_chat_non_text_part_is_a_value_error(llm, part_type):
    messages = [{"role": "user", "content": [PARTS[0], {"type": part_type, part_type: {}}]}]
    with pytest.raises(ValueError, match=f"message 0, content part 1: type '{part_type}' is not supported"):
        llm.chat(messages, SamplingParams(max_tokens=2), use_tqdm=False)
