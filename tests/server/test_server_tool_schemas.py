"""Tool and JSON schemas as vLLM users send them, over HTTP (SmolLM2): nested pydantic models ($defs)
under tool_choice "required" (the openai client's pydantic_function_tool, pydantic-ai), a call cut by
max_tokens (LangChain reports it as invalid), objects closed to unlisted keys unless a request says
otherwise (LangChain's @tool), ASCII regex classes, Llama 3.x's JSON tool calls."""

from __future__ import annotations

import functools
import json
import operator
import re

import httpx
import pytest
from pydantic import BaseModel

MODEL = "SmolLM2-135M-Instruct"
OSLO = [{"role": "user", "content": "Ann lives at 5 Main Street, Oslo, Norway."}]


class Address(BaseModel):
    city: str
    country: str


class Person(BaseModel):
    name: str
    address: Address


class Site(BaseModel):
    class Address(BaseModel):  # the same $defs name as Person's, another definition
        street: str

    address: Address
    floor: int


def _weather_tool():
    from langchain_core.tools import tool

    @tool
    def get_weather(city: str, unit: str = "celsius") -> str:
        """The current weather in a city."""
        return "sunny"

    return get_weather


def _langchain(server, **kwargs):
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(model=MODEL, base_url=server.base_url, api_key="unused", temperature=0, max_retries=0, **kwargs)


def test_required_choice_takes_nested_models_with_clashing_definitions(smollm2_client):
    """Both functions' parameters use "#/$defs/Address", each its own: the call validates against its
    own model (vLLM would refuse the pair; a 400 "Pointer '/$defs/Address' does not exist" before)."""
    from openai import pydantic_function_tool

    tools = [pydantic_function_tool(Person, name="save_person"), pydantic_function_tool(Site, name="save_site")]
    assert "$defs" in tools[0]["function"]["parameters"]
    choice = smollm2_client.chat.completions.create(model=MODEL, messages=OSLO, tools=tools, tool_choice="required",
                                                    parallel_tool_calls=False, temperature=0, max_tokens=80).choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == ""  # vLLM's content for it
    (call,) = choice.message.tool_calls
    model = {"save_person": Person, "save_site": Site}[call.function.name]
    model.model_validate_json(call.function.arguments)


def test_pydantic_ai_output_type_with_a_nested_model(smollm2_server):
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider
    from pydantic_ai.settings import ModelSettings

    model = OpenAIChatModel(MODEL, provider=OpenAIProvider(base_url=smollm2_server.base_url, api_key="unused"))
    agent = Agent(model, output_type=Person, retries=0,
                  model_settings=ModelSettings(temperature=0, max_tokens=80, parallel_tool_calls=False))
    person = agent.run_sync(OSLO[0]["content"]).output
    assert isinstance(person, Person) and isinstance(person.address, Address)


def test_a_required_call_cut_by_max_tokens_is_a_partial_call(smollm2_server):
    """As OpenAI answers a named choice cut short: finish_reason "length", the call so far in
    tool_calls, nothing in content (the list's raw JSON went there before); LangChain then reports
    the call as invalid. Streamed, the call's pieces add up to the same partial call."""
    bound = _langchain(smollm2_server, max_tokens=14).bind_tools([_weather_tool()], tool_choice="required")
    ask = "What is the weather in Paris?"
    message = bound.invoke(ask)
    assert message.response_metadata["finish_reason"] == "length"
    assert message.content == "" and not message.tool_calls
    (invalid,) = message.invalid_tool_calls
    assert invalid["name"] == "get_weather" and invalid["args"].startswith('{"city')  # the schema's first key
    streamed = functools.reduce(operator.add, bound.stream(ask))
    assert streamed.response_metadata["finish_reason"] == "length" and streamed.content == ""
    assert [(c["name"], c["args"]) for c in streamed.tool_call_chunks] == [("get_weather", invalid["args"])]


def test_a_required_call_cut_before_its_name_is_no_call(smollm2_client):
    for stream in (False, True):  # vLLM's test: max_completion_tokens=1 gives no tool_calls, no content
        args = dict(model=MODEL, messages=OSLO, tools=[{"type": "function", "function": {
            "name": "save_person", "parameters": Person.model_json_schema()}}], tool_choice="required",
                    max_completion_tokens=1, temperature=0)
        if not stream:
            choice = smollm2_client.chat.completions.create(**args).choices[0]
            assert (choice.finish_reason, choice.message.content, choice.message.tool_calls) == ("length", "", None)
            continue
        chunks = [c.choices[0] for c in smollm2_client.chat.completions.create(stream=True, **args) if c.choices]
        assert not any(c.delta.tool_calls or c.delta.content for c in chunks)
        assert chunks[-1].finish_reason == "length"


def test_objects_take_no_unlisted_keys_unless_a_request_says_so(smollm2_server, smollm2_client):
    """LangChain's @tool schema says nothing of additionalProperties: the named call's arguments are
    its keys only. A request's disable_additional_properties false opens such objects: an object
    listing no keys but needing one is then satisfiable (closed, it is a 400)."""
    bound = _langchain(smollm2_server, max_tokens=60).bind_tools([_weather_tool()], tool_choice="get_weather")
    message = bound.invoke("What is the weather in Paris?")
    (call,) = message.tool_calls
    assert set(call["args"]) <= {"city", "unit"} and "city" in call["args"]
    needs_a_key = {"type": "object", "properties": {}, "minProperties": 1}
    body = {"model": MODEL, "messages": OSLO, "max_tokens": 40, "temperature": 0,
            "structured_outputs": {"json": needs_a_key}}
    refused = httpx.post(smollm2_server.base_url + "/chat/completions", json=body, timeout=60)
    assert refused.status_code == 400 and "unsatisfiable" in refused.json()["error"]["message"].lower()
    body["structured_outputs"]["disable_additional_properties"] = False
    choice = smollm2_client.chat.completions.create(**{k: v for k, v in body.items() if k != "structured_outputs"},
                                                    extra_body={"structured_outputs": body["structured_outputs"]})
    assert choice.choices[0].finish_reason == "length" or json.loads(choice.choices[0].message.content)


def test_server_switch_sets_the_default_a_request_can_override():
    import argparse

    from aioinfer.entrypoints.openai.structured import with_server_defaults
    from aioinfer.entrypoints.serve_cli import add_serve_parser, config_from_args
    from aioinfer.sampling_params import SamplingParams
    from aioinfer.server_config import ServerConfig

    assert ServerConfig().disable_additional_properties is True
    assert ServerConfig.from_env({"AIOINFER_DISABLE_ADDITIONAL_PROPERTIES": "0"}).disable_additional_properties is False
    parser = argparse.ArgumentParser(prog="aioinfer")
    add_serve_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["serve", "--no-disable-additional-properties"])
    assert config_from_args(args, environ={}).disable_additional_properties is False
    schema = {"type": "object", "properties": {}}
    defaulted = with_server_defaults(SamplingParams(structured_outputs={"json": schema}), False)
    assert defaulted.structured_outputs.disable_additional_properties is False
    own = SamplingParams(structured_outputs={"json": schema, "disable_additional_properties": True})
    with_server_defaults(own, False)
    assert own.structured_outputs.disable_additional_properties is True


@pytest.mark.parametrize("regex", [r"\d{3}-\d{4}", r"\w+\s\w+"])
def test_regex_classes_are_ascii(smollm2_client, regex):
    """With Unicode classes (llguidance's own) these prompts give "🯸🯸🯸-🯸🯸", "आपृणापृणा"."""
    ascii_regex = regex.replace(r"\d", "[0-9]").replace(r"\w", "[0-9A-Za-z_]").replace(r"\s", r"[ \t\n\r\f\v]")
    for prompt in ("What is your phone number?", "Write a phone number in Hindi digits."):
        text = smollm2_client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=16, temperature=0,
            extra_body={"structured_outputs": {"regex": regex}}).choices[0].message.content
        assert re.fullmatch(ascii_regex, text), text


LLAMA_CALLS = ('{"name": "get_weather", "parameters": {"city": "Paris"}}; '
               '{"name": "get_time", "parameters": {"timezone": "Europe/Paris"}}')


@pytest.mark.parametrize("stream,prefix", [(False, ""), (True, "<|python_tag|>")])
def test_llama3_json_tool_calls(smollm2_client, stream, prefix):
    """Llama 3.x writes ``{"name": ..., "parameters": ...}`` calls, ";"-separated, maybe after
    <|python_tag|> (vLLM's llama3_json parser): the output is pinned to that text here (SmolLM2 does
    not write it), and the reply is read as two calls, streamed or not."""
    tools = [{"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}
             for name in ("get_weather", "get_time")]
    args = dict(model=MODEL, messages=[{"role": "user", "content": "Weather and time in Paris?"}], tools=tools,
                temperature=0, max_tokens=60, extra_body={"structured_outputs": {"choice": [prefix + LLAMA_CALLS]}})
    if not stream:
        choice = smollm2_client.chat.completions.create(**args).choices[0]
        calls = [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls]
        content, finish = choice.message.content, choice.finish_reason
    else:
        parts: dict[int, list] = {}
        content, finish = "", None
        for chunk in smollm2_client.chat.completions.create(stream=True, **args):
            delta = chunk.choices[0].delta
            content += delta.content or ""
            for call in delta.tool_calls or ():
                parts.setdefault(call.index, ["", ""])
                parts[call.index][0] += call.function.name or ""
                parts[call.index][1] += call.function.arguments or ""
            finish = chunk.choices[0].finish_reason or finish
        calls = [(name, json.loads(arguments)) for name, arguments in (parts[i] for i in sorted(parts))]
        content = content or None
    assert finish == "tool_calls" and content is None
    assert calls == [("get_weather", {"city": "Paris"}), ("get_time", {"timezone": "Europe/Paris"})]
