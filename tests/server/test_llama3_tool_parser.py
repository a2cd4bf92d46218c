"""Llama 3.x's JSON tool calls (vLLM's ``llama3_json`` parser's format) read by tool_call_parser.py
under tool_choice "auto": ``{"name": ..., "parameters": {...}}`` objects, optionally after
``<|python_tag|>``, several separated by ``;``; streamed in any pieces, the same message as whole."""

from __future__ import annotations

import json
import random

import pytest

from aioinfer.entrypoints.openai.tool_call_parser import ToolCallParser

NAMES = {"get_weather", "get_time"}
WEATHER = '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}'
TIME = '{"name": "get_time", "parameters": {"timezone": "Europe/Paris"}}'


def _whole(text: str, max_calls=None) -> ToolCallParser:
    parser = ToolCallParser("auto", NAMES, max_calls=max_calls)
    parser.feed(text)
    parser.finish()
    return parser


def _calls(parser: ToolCallParser) -> list[tuple[str, dict]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parser.calls]


@pytest.mark.parametrize("text", [
    WEATHER,
    "<|python_tag|>" + WEATHER,
    " <|python_tag|> " + WEATHER + " \n",
    WEATHER + "; " + TIME,
    "<|python_tag|>" + WEATHER + ";" + TIME,
    WEATHER + "\n" + TIME,  # newline-separated, as Llama 3.2 also writes them
    '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}; ' + TIME,  # "arguments" too
])
def test_llama3_calls_are_calls(text):
    parser = _whole(text)
    assert parser.content is None
    expected = [("get_weather", {"city": "Paris", "unit": "celsius"}), ("get_time", {"timezone": "Europe/Paris"})]
    assert _calls(parser) == expected[:text.count('"name"')]


@pytest.mark.parametrize("text", [
    "The call would be " + WEATHER,  # JSON inside prose stays prose (vLLM's legacy parser took it out)
    WEATHER + "; and then the time",  # not only calls
    '{"name": "get_news", "parameters": {}}; ' + TIME,  # a function the request did not give
    '{"name": "get_weather", "parameters": "Paris"}',  # arguments that are not an object
    "<|python_tag|>brave_search.call(query=\"weather\")",  # Llama's built-in tools: not JSON
    "<|python_tag|>",
    WEATHER[:-1],  # cut short
])
def test_what_is_not_only_calls_is_content(text):
    parser = _whole(text)
    assert parser.calls == [] and parser.content == text


def test_parallel_tool_calls_false_keeps_the_first():
    assert _calls(_whole(WEATHER + "; " + TIME, max_calls=1)) == [("get_weather", {"city": "Paris", "unit": "celsius"})]


def test_streamed_in_any_pieces_it_is_the_same_message():
    rng = random.Random(3)
    texts = [WEATHER + "; " + TIME, "<|python_tag|>" + TIME, "<|python_tag|> hello", "<|python hello", "<b>hi</b>"]
    for text in texts:
        whole = _whole(text)
        for _ in range(50):
            parser = ToolCallParser("auto", NAMES)
            cuts = sorted(rng.sample(range(1, len(text)), k=min(len(text) - 1, rng.randint(0, 6))))
            sent, items = "", []
            for start, end in zip([0, *cuts], [*cuts, len(text)]):
                content, new = parser.feed(text[start:end])
                sent, items = sent + content, items + new
            content, new = parser.finish()
            sent, items = sent + content, items + new
            assert (sent, parser.content) == (whole.content or "", whole.content), text
            assert [i["function"] for i in items] == [c["function"] for c in whole.calls]


def test_a_reply_that_may_start_with_the_tag_waits_and_other_text_does_not():
    parser = ToolCallParser("auto", NAMES)
    assert parser.feed("<|python_") == ("", [])  # may be the tag yet
    parser = ToolCallParser("auto", NAMES)
    assert parser.feed("<p>Hello") == ("<p>Hello", [])  # cannot be: sent as it comes


def test_serve_takes_vllms_flag_for_it():
    """``vllm serve ... --tool-call-parser llama3_json`` copied as it is (the flag changes nothing:
    both formats are always read); a parser aioinfer does not have stays an argparse error."""
    import argparse

    from aioinfer.entrypoints.serve_cli import add_serve_parser

    parser = argparse.ArgumentParser(prog="aioinfer")
    add_serve_parser(parser.add_subparsers(dest="command", required=True))
    for name in ("llama3_json", "hermes"):
        args = parser.parse_args(["serve", "m", "--enable-auto-tool-choice", "--tool-call-parser", name])
        assert args.tool_call_parser == name
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "m", "--tool-call-parser", "pythonic"])
