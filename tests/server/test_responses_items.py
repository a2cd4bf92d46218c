"""A Responses stream's output items beside tools (entrypoints/openai/responses_items.py): however
the text is cut into deltas, the events open each item once, never interleave two, add up to the
finished items, and those are the items the whole text gives at once (the unstreamed route)."""

from __future__ import annotations

import json
import random

import pytest

from aioinfer.entrypoints.openai.responses_events import ResponseEvents
from aioinfer.entrypoints.openai.responses_items import ResponseItems
from aioinfer.entrypoints.openai.tool_call_parser import ToolCallParser
from test_tool_call_parser import AUTO_TEXTS, NAMES, REQUIRED_TEXT, WEATHER_CALL

NAMED_TEXT = '  {"city": "Paris", "unit": "celsius", "note": "a \\"quoted\\" }"}\n'


def _items(mode: str) -> ResponseItems:
    parser = ToolCallParser(mode, NAMES, named="get_weather" if mode == "named" else None)
    counter = iter(range(1000))

    def message(text, status):
        return {"type": "message", "id": "msg_1", "status": status, "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}
    return ResponseItems(ResponseEvents(), parser, message, lambda: f"fc_{next(counter)}")


def _decoded(chunks: list[bytes]) -> list[dict]:
    return [json.loads(chunk.split(b"\ndata: ", 1)[1]) for chunk in chunks]


def _run(mode: str, pieces: list[str], status: str = "completed") -> tuple[list[dict], list[dict]]:
    """(the events, the finished output items) of ``pieces`` streamed."""
    items = _items(mode)
    chunks = [chunk for piece in pieces for chunk in items.feed(piece, None)]
    chunks += items.finish(status)
    return _decoded(chunks), items.output(status)


def _check_events(events: list[dict], output: list[dict]) -> None:
    """Each item opened once and closed once, in output order, not interleaved; its deltas add up to it."""
    current, built = None, []
    for event in events:
        kind = event["type"]
        if kind == "response.output_item.added":
            assert current is None, "an item opened inside another"
            assert event["output_index"] == len(built)
            current = {"item": event["item"], "text": "", "arguments": ""}
            continue
        assert current is not None and event["output_index"] == len(built), event
        if kind == "response.output_text.delta":
            current["text"] += event["delta"]
        elif kind == "response.function_call_arguments.delta":
            current["arguments"] += event["delta"]
        elif kind == "response.function_call_arguments.done":
            assert event["arguments"] == current["arguments"]
        elif kind == "response.output_text.done":
            assert event["text"] == current["text"]
        elif kind == "response.output_item.done":
            item = event["item"]
            assert item["id"] == current["item"]["id"]
            if item["type"] == "message":
                assert item["content"][0]["text"] == current["text"]
            else:
                assert item["arguments"] == current["arguments"]
            built.append(item)
            current = None
    assert current is None and built == output


def _without_ids(output: list[dict]) -> list[dict]:
    return [{k: v for k, v in item.items() if k not in ("id", "call_id")} for item in output]


CASES = [("auto", text) for text in AUTO_TEXTS] + [("required", REQUIRED_TEXT), ("required", "[{"),
                                                   ("required", '[{"name": "get_time", "parameters": {}}, {"na'),
                                                   ("named", NAMED_TEXT), ("named", "")]


@pytest.mark.parametrize("mode,text", CASES)
def test_streamed_items_add_up_to_the_whole_texts(mode, text):
    rng = random.Random(7)
    whole_events, whole = _run(mode, [text])
    _check_events(whole_events, whole)
    for _ in range(30):
        cut, i = [], 0
        while i < len(text):
            j = i + rng.randint(1, 5)
            cut.append(text[i:j])
            i = j
        events, output = _run(mode, cut)
        _check_events(events, output)
        assert _without_ids(output) == _without_ids(whole)


def test_calls_go_out_as_they_are_written():
    """A named function's arguments are sent while they are written; a block under auto is a whole
    item (opened, its arguments, closed) as soon as its ``</tool_call>`` is; text after calls is a
    message after them."""
    items = _items("named")
    first = _decoded(items.feed('{"city": ', None))
    assert [e["type"] for e in first] == ["response.output_item.added", "response.function_call_arguments.delta"]
    assert first[0]["item"]["name"] == "get_weather" and first[0]["item"]["status"] == "in_progress"
    assert [e["type"] for e in _decoded(items.feed('"Paris"}', None))] == ["response.function_call_arguments.delta"]
    last = _decoded(items.finish("completed"))
    assert [e["type"] for e in last] == ["response.function_call_arguments.done", "response.output_item.done"]
    assert json.loads(last[-1]["item"]["arguments"]) == {"city": "Paris"}

    items = _items("auto")
    assert _decoded(items.feed(f"<tool_call>{WEATHER_CALL}", None)) == []
    block = _decoded(items.feed("</tool_call>\nDone", None))
    assert [e["type"] for e in block] == ["response.output_item.added", "response.function_call_arguments.delta",
                                         "response.function_call_arguments.done", "response.output_item.done"]
    assert block[-1]["item"]["status"] == "completed"
    rest = _decoded(items.finish("completed"))
    assert rest[0]["type"] == "response.output_item.added" and rest[0]["output_index"] == 1
    assert [item["type"] for item in items.output("completed")] == ["function_call", "message"]


def test_a_call_written_after_content_waits_for_the_message():
    items = _items("auto")
    events = _decoded(items.feed(f"Let me check. <tool_call>{WEATHER_CALL}</tool_call>", None))
    assert [e["type"] for e in events] == ["response.output_item.added", "response.content_part.added",
                                          "response.output_text.delta"]
    events = _decoded(items.finish("incomplete"))
    assert [e["type"] for e in events][:3] == ["response.output_text.done", "response.content_part.done",
                                               "response.output_item.done"]
    message, call = items.output("incomplete")
    assert message["content"][0]["text"] == "Let me check." and message["status"] == "incomplete"
    assert call["status"] == "completed"  # its block was whole: max_output_tokens cut what came after
