"""``--enforce-strict-tools``: under tool_choice "auto", calls to ``strict`` functions held to their
schemas by a structural tag (entrypoints/openai/tool_calls.py ``strict_calls``)."""

from __future__ import annotations

import json

import jsonschema
import pytest

from aioinfer.entrypoints.openai.protocol import ChatCompletionRequest
from aioinfer.entrypoints.openai.tool_calls import tool_plan

WEATHER = {"type": "object", "additionalProperties": False, "required": ["city", "unit"],
           "properties": {"city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["celsius", "fahrenheit"]}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather of a city",
                                           "parameters": WEATHER, "strict": True}},
         {"type": "function", "function": {"name": "get_time", "description": "Current time in a timezone",
                                           "parameters": {"type": "object", "properties": {
                                               "timezone": {"type": "string"}}}}}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
TOOL_CALL_TOKEN = 151657  # Qwen2.5's <tool_call>


def _plan(enforce_strict=True, **fields):
    return tool_plan(ChatCompletionRequest.model_validate({"messages": ASK, "tools": TOOLS, **fields}),
                     enforce_strict=enforce_strict)


def test_the_plan_under_auto():
    tag = _plan().constraint.structural_tag
    assert tag["triggers"] == ["<tool_call>"]
    assert tag["structures"] == [
        {"begin": '<tool_call>\n{"name": "get_weather", "arguments": ', "schema": WEATHER, "end": "}\n</tool_call>"},
        {"begin": '<tool_call>\n{"name": "get_time", "arguments": ', "schema": {"type": "object"},
         "end": "}\n</tool_call>"}]  # not strict: any object
    # Off (the default), no strict function, or a tool_choice with its own constraint: as before.
    assert _plan(enforce_strict=False).constraint is None
    assert tool_plan(ChatCompletionRequest.model_validate({"messages": ASK, "tools": TOOLS[1:]}),
                     enforce_strict=True).constraint is None
    assert _plan(tool_choice="none").constraint is None
    assert _plan(tool_choice="required").constraint.json["type"] == "array"
    allowed = _plan(tool_choice={"type": "allowed_tools", "allowed_tools": {
        "mode": "auto", "tools": [{"type": "function", "function": {"name": "get_weather"}}]}})
    assert [s["begin"] for s in allowed.constraint.structural_tag["structures"]] == [
        '<tool_call>\n{"name": "get_weather", "arguments": ']  # only the allowed ones may be called


def test_the_switch_reads_from_the_environment_and_the_cli():
    import argparse

    from aioinfer.entrypoints.serve_cli import add_serve_parser, config_from_args
    from aioinfer.server_config import ServerConfig

    parser = argparse.ArgumentParser()
    add_serve_parser(parser.add_subparsers(dest="command", required=True))
    assert ServerConfig().enforce_strict_tools is False
    assert ServerConfig.from_env({"AIOINFER_ENFORCE_STRICT_TOOLS": "1"}).enforce_strict_tools is True
    assert config_from_args(parser.parse_args(["serve", "m", "--enforce-strict-tools"]), {}).enforce_strict_tools
    assert not config_from_args(parser.parse_args(["serve", "m"]), {}).enforce_strict_tools


@pytest.mark.slow
def test_qwen25_calls_are_held_to_the_strict_schema(qwen25_coder_gguf):
    """The real model, tokenizer and grammar. A logit bias on ``<tool_call>`` makes the model open a
    call at every chance it has: unconstrained it writes the tag over and over and no call comes out;
    with the structural tag each opened call is written whole in the hermes form, and the strict
    function's arguments match its schema."""
    from aioinfer import LLM, SamplingParams

    llm = LLM(model=str(qwen25_coder_gguf), dtype="float32", device="cpu", max_model_len=2048)
    plan = _plan()

    def reply(constraint):
        params = SamplingParams(temperature=0, max_tokens=60, logit_bias={TOOL_CALL_TOKEN: 100},
                                structured_outputs=constraint)
        return llm.chat(ASK, params, use_tqdm=False, tools=TOOLS)[0].outputs[0].text

    free = reply(None)
    assert free.startswith("<tool_call><tool_call>") and plan.parse(free)[1] == []
    held = reply(plan.constraint)
    calls = plan.parse(held)[1]
    assert calls and calls[0]["function"]["name"] == "get_weather", held
    for call in calls:
        if call["function"]["name"] == "get_weather":
            jsonschema.validate(json.loads(call["function"]["arguments"]), WEATHER)
