"""A choice's text read as tool calls while it streams (entrypoints/openai/tool_call_parser.py): the
pieces add up to the message the whole text gives, however the text is cut into deltas; content is
sent as soon as it cannot be a call, and never a piece of ``<tool_call>``."""

from __future__ import annotations

import json
import random

import pytest

from aioinfer.entrypoints.openai.tool_call_parser import ToolCallParser

NAMES = {"get_weather", "get_time"}
WEATHER_CALL = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}'
AUTO_TEXTS = [
    f"Let me check.\n<tool_call>\n{WEATHER_CALL}\n</tool_call>\n"
    '<tool_call>{"name": "get_time", "arguments": {"timezone": "Europe/Paris"}}',  # the last unterminated
    ' {"name": "get_time", "parameters": {"timezone": "Asia/Tokyo"}}\n',  # bare
    '```json\n{"name": "get_time", "arguments": {}}\n```',  # bare, fenced
    '[{"name": "get_time", "arguments": {}}, {"name": "get_weather", "arguments": {}}]',
    "```python\nprint('<tool_call>')\n```",
    "The weather in Paris is sunny.  \n",
    "Hello <tool_ca but not a tag <",
    '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>',  # an unknown function: content
    '<tool_call>{"name": "get_weather", "arguments": </tool_call>',  # broken JSON: content
    f"Sure <tool_call>{WEATHER_CALL}</tool_call> and then some text",
    f"\n\n<tool_call>{WEATHER_CALL}</tool_call>\n",
    '{"city": "Paris"}',  # JSON that is not a call
    "",
    "   ",
]
REQUIRED_TEXT = ('[{"name": "get_weather", "parameters": {"city": "Pa\\"ris}", "unit": "celsius"}}, '
                 '{"name": "get_time", "parameters": {"timezone": "Europe/Paris"}}]')


def _stream(parser: ToolCallParser, pieces: list[str]) -> tuple[str, list[dict], list[str]]:
    """Feed ``pieces``, then finish: (content sent, tool-call items sent, the content of each feed)."""
    sent, items, per_feed = "", [], []
    for piece in pieces:
        content, new = parser.feed(piece)
        sent, items = sent + content, items + new
        per_feed.append(content)
    content, new = parser.finish()
    return sent + content, items + new, per_feed


def _cuts(text: str, rng: random.Random) -> list[str]:
    pieces, i = [], 0
    while i < len(text):
        j = i + rng.randint(1, 6)
        pieces.append(text[i:j])
        i = j
    return pieces


def _joined(items: list[dict]) -> list[dict]:
    """The calls the items add up to, as a client joins them (by index: id, name, arguments)."""
    calls: dict[int, dict] = {}
    for item in items:
        call = calls.setdefault(item["index"], {"id": None, "name": "", "arguments": ""})
        call["id"] = item.get("id") or call["id"]
        call["name"] += item["function"].get("name") or ""
        call["arguments"] += item["function"].get("arguments") or ""
    return [calls[i] for i in sorted(calls)]


@pytest.mark.parametrize("mode,texts", [("auto", AUTO_TEXTS), ("required", [REQUIRED_TEXT, REQUIRED_TEXT[:70], "["]),
                                        ("named", [' {"city": "Paris", "unit": "celsius"} ', "", '{"city": "Pa'])])
def test_streamed_pieces_add_up_to_the_whole_message(mode, texts):
    rng = random.Random(0)
    for text in texts:
        whole = ToolCallParser(mode, NAMES, named="get_weather" if mode == "named" else None)
        whole.feed(text)
        whole.finish()
        for _ in range(30):
            parser = ToolCallParser(mode, NAMES, named=whole.named)
            content, items, _ = _stream(parser, _cuts(text, rng))
            assert content == (whole.content or ""), text
            assert parser.content == whole.content
            assert [c["function"] for c in parser.calls] == [c["function"] for c in whole.calls], text
            # The items, joined as a client does, are the message's calls, ids included.
            assert _joined(items) == [{"id": c["id"], **c["function"]} for c in parser.calls]


def test_auto_content_is_sent_as_it_comes_and_no_piece_of_a_tag():
    text = f"Let me check the weather.   \n<tool_call>\n{WEATHER_CALL}\n</tool_call>"
    parser = ToolCallParser("auto", NAMES)
    content, items, per_feed = _stream(parser, list(text))  # a character a delta
    assert content == "Let me check the weather." and parser.content == content
    assert [c["function"]["name"] for c in parser.calls] == ["get_weather"]
    # Each character of the sentence went out with its own delta, nothing of the tag or the space before it.
    assert "".join(per_feed[:len("Let me check the weather.")]) == "Let me check the weather."
    assert "".join(per_feed) == content
    # The call went out when its block closed, not at the end.
    fed = ToolCallParser("auto", NAMES)
    sent_call = [bool(fed.feed(char)[1]) for char in text]
    assert sent_call.index(True) == len(text) - 1
    # A plain answer streams to its last character; a tag's beginning waits until it is not one.
    parser = ToolCallParser("auto", NAMES)
    assert parser.feed("Use <tool") == ("Use", [])
    assert parser.feed("box.") == (" <toolbox.", [])


def test_a_reply_that_may_be_a_bare_call_waits_for_its_end():
    for start in ('{"name": "get_time"', "```json\n{", "``", "\n["):
        parser = ToolCallParser("auto", NAMES)
        assert parser.feed(start) == ("", [])
    parser = ToolCallParser("auto", NAMES)
    assert parser.feed("```python\nx = 1") == ("```python\nx = 1", [])  # code, not a call: sent


def test_named_arguments_stream_after_the_id_and_name():
    parser = ToolCallParser("named", NAMES, named="get_time")
    content, items = parser.feed('{"time')
    assert content == "" and items[0]["id"].startswith("call_") and items[0]["function"] == {
        "name": "get_time", "arguments": '{"time'}
    assert parser.feed('zone": "UTC"} ') == ("", [{"index": 0, "function": {"arguments": 'zone": "UTC"}'}}])
    assert parser.finish() == ("", [])
    assert parser.content is None and json.loads(parser.calls[0]["function"]["arguments"]) == {"timezone": "UTC"}


def test_required_calls_go_out_as_their_objects_close():
    parser = ToolCallParser("required", NAMES)
    end_of_first = REQUIRED_TEXT.index("}}") + 2
    assert parser.feed(REQUIRED_TEXT[:end_of_first - 1]) == ("", [])
    content, items = parser.feed(REQUIRED_TEXT[end_of_first - 1:end_of_first])
    assert items[0]["function"]["name"] == "get_weather"
    assert json.loads(items[0]["function"]["arguments"]) == {"city": 'Pa"ris}', "unit": "celsius"}
    # Cut by max_tokens inside the second call's name: the first is kept, the text is never content.
    parser.feed(REQUIRED_TEXT[end_of_first:end_of_first + 20])
    assert parser.finish() == ("", []) and parser.content is None and len(parser.calls) == 1


def test_a_required_call_cut_by_max_tokens_is_sent_as_far_as_written():
    """OpenAI's answer to a named choice cut short, for "required" too: the call being written, once
    its name is complete, with its arguments so far ("" before they begin); never the list as content."""
    for cut, expected in [(1, None), (12, None), (25, ""), (38, ""), (40, "{"), (51, '{"city": "Pa')]:
        parser = ToolCallParser("required", NAMES)
        parser.feed(REQUIRED_TEXT[:cut])
        content, items = parser.finish()
        assert content == "" and parser.content is None, cut
        if expected is None:
            assert items == [] and parser.calls == [], cut
        else:
            assert [(i["index"], i["function"]) for i in items] == [(0, {"name": "get_weather", "arguments": expected})]
    parser = ToolCallParser("required", NAMES, max_calls=1)  # parallel_tool_calls false: one call, complete
    parser.feed(REQUIRED_TEXT[:REQUIRED_TEXT.index("}}") + 30])
    parser.finish()
    assert len(parser.calls) == 1 and json.loads(parser.calls[0]["function"]["arguments"])


def test_parallel_tool_calls_false_keeps_the_first_call():
    text = AUTO_TEXTS[0]  # two calls
    whole = ToolCallParser("auto", NAMES, max_calls=1)
    whole.feed(text)
    whole.finish()
    assert whole.content == "Let me check." and [c["function"]["name"] for c in whole.calls] == ["get_weather"]
    content, items, _ = _stream(ToolCallParser("auto", NAMES, max_calls=1), list(text))
    assert content == "Let me check." and [item["function"]["name"] for item in items] == ["get_weather"]
    bare_list = ToolCallParser("auto", NAMES, max_calls=1)
    bare_list.feed(AUTO_TEXTS[3])
    bare_list.finish()
    assert bare_list.content is None and [c["function"]["name"] for c in bare_list.calls] == ["get_time"]


def test_random_texts_add_up_the_same_however_cut():
    """Texts made of tags, pieces of tags, calls, fences and prose, in every mode, with and without
    ``parallel_tool_calls``: the streamed pieces always add up to the whole text's message."""
    pieces = ["<tool_call>", "</tool_call>", "<tool", "_call>", "</tool", "\n", " ", "{", "}", "[", "]", "```",
              "```json", '{"name": "get_time", "arguments": {}}', '{"name": "get_weather", "parameters": {"city": "x"}}',
              '{"name": "nope", "arguments": {}}', "Hello", " world.", ",", '"', "\\", ": ", "<", "`",
              "<|python_tag|>", "<|python", "; ", '[{"name": "get_time", "parameters": {"timezone": "U']
    rng = random.Random(7)
    for _ in range(2000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))
        mode, max_calls = rng.choice(["auto", "required", "named"]), rng.choice([None, 1])
        whole = ToolCallParser(mode, NAMES, named="get_time", max_calls=max_calls)
        whole.feed(text)
        whole.finish()
        parser = ToolCallParser(mode, NAMES, named="get_time", max_calls=max_calls)
        content, items, _ = _stream(parser, _cuts(text, rng))
        assert (content, parser.content) == (whole.content or "", whole.content), (mode, text)
        assert [c["function"] for c in parser.calls] == [c["function"] for c in whole.calls], (mode, text)
        assert _joined(items) == [{"id": c["id"], **c["function"]} for c in parser.calls]
