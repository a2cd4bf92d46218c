"""EventTemplate: the bytes of a pre-encoded chunk equal encoding the whole object, for any text."""

from __future__ import annotations

import pytest

from aioinfer.entrypoints.openai.sse import EventTemplate, event, text_marker

TEXTS = ["", "hello", ' "quoted" \\ back', "日本語 🎉", "\n\t\x00\x1f", "\u2028\u2029", text_marker(), "\ufffd"]


@pytest.mark.parametrize("text", TEXTS)
def test_filled_template_equals_the_encoded_object(text):
    def chunk(value):
        return {"id": "cmpl-1", "object": "text_completion", "created": 5, "model": "m",
                "choices": [{"index": 3, "text": value, "logprobs": None, "finish_reason": None, "stop_reason": None}],
                "usage": None}

    assert EventTemplate(chunk(text_marker())).fill(text) == event(chunk(text))
    chat = {"id": "c", "choices": [{"index": 0, "delta": {"content": text_marker()}}]}
    assert EventTemplate(chat).fill(text) == event({"id": "c", "choices": [{"index": 0, "delta": {"content": text}}]})


def test_a_template_needs_exactly_one_marker():
    with pytest.raises(ValueError):
        EventTemplate({"a": "b"})
    with pytest.raises(ValueError):
        EventTemplate({"a": text_marker(), "b": text_marker()})
