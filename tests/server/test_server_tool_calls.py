"""Tool calling over HTTP with the real openai client, LangChain and openai-agents: each tool_choice,
streamed and not; the arguments always parse (and validate where the grammar imposed them); tool
results in the history."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest
from pydantic import BaseModel, Field

MODEL = "SmolLM2-135M-Instruct"
WEATHER = {"type": "object", "additionalProperties": False, "required": ["city", "unit"],
           "properties": {"city": {"type": "string", "maxLength": 30}, "unit": {"enum": ["celsius", "fahrenheit"]}}}
TIME = {"type": "object", "additionalProperties": False, "required": ["timezone"],
        "properties": {"timezone": {"type": "string", "pattern": "^[A-Z][a-z]+/[A-Z][a-z]+$"}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather of a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "description": "Current time in a timezone",
                                           "parameters": TIME}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
ASK = [{"role": "user", "content": "What is the weather in Paris right now?"}]


def _calls(smollm2_client, stream: bool, **args) -> tuple[list[dict], str, object]:
    """(tool calls as dicts, finish_reason, content) of one choice, streamed (chunks joined) or not."""
    args = dict(model=MODEL, messages=ASK, tools=TOOLS, temperature=0, max_tokens=120, **args)
    if not stream:
        choice = smollm2_client.chat.completions.create(**args).choices[0]
        calls = [c.model_dump() for c in choice.message.tool_calls or ()]
        return calls, choice.finish_reason, choice.message.content
    calls: dict[int, dict] = {}
    content, finish = "", None
    for chunk in smollm2_client.chat.completions.create(stream=True, **args):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for call in delta.tool_calls or ():
            entry = calls.setdefault(call.index, {"id": call.id, "type": "function",
                                                  "function": {"name": "", "arguments": ""}})
            entry["function"]["name"] += call.function.name or ""
            entry["function"]["arguments"] += call.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    return [calls[i] for i in sorted(calls)], finish, content or None


@pytest.mark.parametrize("stream", [False, True])
def test_named_and_required_calls_always_parse(smollm2_client, stream):
    calls, finish, content = _calls(smollm2_client, stream, tool_choice={"type": "function", "function": {"name": "get_time"}})
    # content: "" beside a constrained choice's calls, as vLLM's (streamed: no content deltas); a named
    # function's choice ends "stop" (OpenAI's API, vLLM's), "required" ends "tool_calls"
    assert finish == "stop" and content == (None if stream else "") and len(calls) == 1
    assert calls[0]["function"]["name"] == "get_time" and calls[0]["id"].startswith("call_")
    jsonschema.validate(json.loads(calls[0]["function"]["arguments"]), TIME)
    calls, finish, _ = _calls(smollm2_client, stream, tool_choice="required", parallel_tool_calls=False)
    assert finish == "tool_calls" and len(calls) == 1
    jsonschema.validate(json.loads(calls[0]["function"]["arguments"]), SCHEMAS[calls[0]["function"]["name"]])


@pytest.mark.parametrize("stream", [False, True])
def test_allowed_tools_required_calls_only_those(smollm2_client, stream):
    """OpenAI's allowed_tools: both tools are in the prompt, but a weather question may only be answered
    by a call to get_time, the one allowed."""
    allowed = {"type": "allowed_tools",
               "allowed_tools": {"mode": "required", "tools": [{"type": "function", "function": {"name": "get_time"}}]}}
    calls, finish, content = _calls(smollm2_client, stream, tool_choice=allowed)
    assert finish == "tool_calls" and content == (None if stream else "") and calls
    for call in calls:
        assert call["function"]["name"] == "get_time"
        jsonschema.validate(json.loads(call["function"]["arguments"]), TIME)


def test_a_function_without_parameters_gets_empty_arguments(smollm2_client):
    """No ``parameters`` (or ``{}``) is a function of no arguments: a required or named call's arguments
    are ``{}`` whatever the model would have made up."""
    for parameters in (None, {}):
        function = {"name": "get_time_utc", "description": "Current UTC time"}
        if parameters is not None:
            function["parameters"] = parameters
        tools = TOOLS + [{"type": "function", "function": function}]
        for choice in ({"type": "function", "function": {"name": "get_time_utc"}},
                       {"type": "allowed_tools", "allowed_tools": {
                           "mode": "required", "tools": [{"type": "function", "function": {"name": "get_time_utc"}}]}}):
            message = smollm2_client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "What time is it in UTC?"}], tools=tools,
                tool_choice=choice, parallel_tool_calls=False, temperature=0, max_tokens=40).choices[0].message
            assert [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls] == [
                ("get_time_utc", {})]


@pytest.mark.parametrize("stream", [False, True])
def test_auto_and_none(smollm2_client, stream):
    calls, finish, content = _calls(smollm2_client, stream, tool_choice="none")
    assert calls == [] and finish in ("stop", "length") and content
    # auto: the model's choice; whatever it wrote is either calls that parse or plain content.
    calls, finish, content = _calls(smollm2_client, stream, tool_choice="auto")
    if calls:
        assert finish == "tool_calls"
        for call in calls:
            assert call["function"]["name"] in SCHEMAS
            assert isinstance(json.loads(call["function"]["arguments"]), dict)
    else:
        assert content and finish in ("stop", "length")


def test_streams_beside_tools_as_written(smollm2_client):
    """With tools, a text answer streams token by token (not whole at the end) and a named call's arguments as they are written; each adds up to the same
    request's unstreamed message, and logprobs come for every token."""
    hello = [{"role": "user", "content": "Say hello to me in one sentence."}]
    args = dict(model=MODEL, messages=hello, tools=TOOLS, tool_choice="auto", temperature=0, max_tokens=40)
    message = smollm2_client.chat.completions.create(**args).choices[0].message
    assert message.content and not message.tool_calls  # SmolLM2 answers this one in text
    chunks = list(smollm2_client.chat.completions.create(stream=True, logprobs=True,
                                                         stream_options={"include_usage": True}, **args))
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(pieces) > 3 and "".join(pieces) == message.content
    logprobs = [lp for c in chunks if c.choices and c.choices[0].logprobs for lp in c.choices[0].logprobs.content]
    assert len(logprobs) == chunks[-1].usage.completion_tokens
    named = dict(args, messages=ASK, tool_choice={"type": "function", "function": {"name": "get_weather"}})
    [expected] = smollm2_client.chat.completions.create(**named).choices[0].message.tool_calls
    fragments = [call for c in smollm2_client.chat.completions.create(stream=True, **named) if c.choices
                 for call in c.choices[0].delta.tool_calls or ()]
    assert len(fragments) > 3 and fragments[0].id.startswith("call_") and fragments[0].function.name == "get_weather"
    assert "".join(f.function.arguments for f in fragments) == expected.function.arguments


def test_auto_parses_hermes_calls_out_of_the_text():
    from aioinfer.entrypoints.openai.protocol import ChatCompletionRequest
    from aioinfer.entrypoints.openai.tool_calls import tool_plan

    plan = tool_plan(ChatCompletionRequest.model_validate({"messages": ASK, "tools": TOOLS}))
    two_calls = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n'
                 '</tool_call>\n<tool_call>{"name": "get_time", "arguments": {"timezone": "Europe/Paris"}}')  # unterminated
    content, calls = plan.parse(two_calls)
    assert content == "Let me check."
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Paris", "unit": "celsius"}), ("get_time", {"timezone": "Europe/Paris"})]
    assert len({c["id"] for c in calls}) == 2
    # A bare call (no tags) is one too; a list of them as well.
    content, calls = plan.parse(' {"name": "get_time", "parameters": {"timezone": "Asia/Tokyo"}}\n')
    assert content is None and json.loads(calls[0]["function"]["arguments"]) == {"timezone": "Asia/Tokyo"}
    assert len(plan.parse('[{"name": "get_time", "arguments": {}}, {"name": "get_weather", "arguments": {}}]')[1]) == 2
    assert len(plan.parse('```json\n{"name": "get_time", "arguments": {}}\n```')[1]) == 1
    # Not calls: broken JSON, an unknown function, JSON that is not a call; the text stays content.
    for text in ('<tool_call>{"name": "get_weather", "arguments": </tool_call>',
                 '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>', '{"city": "Paris"}', '[1, 2]'):
        assert plan.parse(text) == (text, [])
    # allowed_tools in auto mode: a call to a tool not allowed is not a call either.
    only_time = {"type": "allowed_tools", "allowed_tools": {
        "mode": "auto", "tools": [{"type": "function", "function": {"name": "get_time"}}]}}
    plan = tool_plan(ChatCompletionRequest.model_validate({"messages": ASK, "tools": TOOLS, "tool_choice": only_time}))
    assert plan.tools == TOOLS  # every tool still shown to the model
    weather = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}</tool_call>'
    assert plan.parse(weather) == (weather, [])
    assert plan.parse('<tool_call>{"name": "get_time", "arguments": {}}</tool_call>')[1][0]["function"]["name"] == "get_time"
    # parallel_tool_calls false: the first call only.
    plan = tool_plan(ChatCompletionRequest.model_validate({"messages": ASK, "tools": TOOLS, "parallel_tool_calls": False}))
    assert [c["function"]["name"] for c in plan.parse(two_calls)[1]] == ["get_weather"]


@pytest.mark.slow
def test_qwen25_auto_call_parses(qwen25_coder_gguf):
    """A template that renders tools (Qwen2.5's) and a model that calls one: the reply parses into the call."""
    from aioinfer import LLM, SamplingParams
    from aioinfer.entrypoints.openai.protocol import ChatCompletionRequest
    from aioinfer.entrypoints.openai.tool_calls import tool_plan

    llm = LLM(model=str(qwen25_coder_gguf), dtype="float32", device="cpu", max_model_len=2048)
    output = llm.chat(ASK, SamplingParams(temperature=0, max_tokens=60), use_tqdm=False, tools=TOOLS)[0]
    assert "<tools>" in output.prompt  # rendered by the model's own template
    _, calls = tool_plan(ChatCompletionRequest.model_validate({"messages": ASK, "tools": TOOLS})).parse(
        output.outputs[0].text)
    assert [c["function"]["name"] for c in calls] == ["get_weather"], output.outputs[0].text
    assert json.loads(calls[0]["function"]["arguments"])["city"] == "Paris"


def test_tool_results_in_the_history(smollm2_client):
    first = smollm2_client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, temperature=0, max_tokens=80,
                                           tool_choice={"type": "function", "function": {"name": "get_weather"}})
    call = first.choices[0].message.tool_calls[0]
    messages = ASK + [first.choices[0].message.model_dump(exclude_none=True),
                      {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21, "sky": "clear"}'}]
    reply = smollm2_client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, tool_choice="none",
                                           temperature=0, max_tokens=40)
    assert reply.choices[0].message.content and reply.choices[0].message.tool_calls is None


def test_inconsistent_tool_fields_are_400s(smollm2_server):
    cases = [({"tool_choice": "required"}, "tool_choice needs tools", "tool_choice"),
             ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "not in tools",
              "tool_choice"),
             ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
              "constrains the output already", "tool_choice"),
             ({"tools": TOOLS, "tool_choice": {"type": "allowed_tools", "allowed_tools": {
                 "mode": "required", "tools": [{"type": "function", "function": {"name": "nope"}}]}}},
              "'nope', not in tools", "tool_choice.allowed_tools.tools"),
             ({"tools": TOOLS, "tool_choice": {"type": "allowed_tools", "allowed_tools": {
                 "mode": "sometimes", "tools": [{"type": "function", "function": {"name": "get_time"}}]}}},
              "'auto' or 'required'", "tool_choice.allowed_tools.mode"),
             ({"tools": TOOLS, "tool_choice": {"type": "custom", "custom": {"name": "get_time"}}},
              "type 'custom' is not supported", "tool_choice")]
    for extra, message, param in cases:
        response = httpx.post(smollm2_server.base_url + "/chat/completions", timeout=60,
                              json={"model": MODEL, "messages": ASK, "max_tokens": 4, **extra})
        assert response.status_code == 400, response.text
        assert message in response.json()["error"]["message"] and response.json()["error"]["param"] == param


class Weather(BaseModel):
    """Current weather of a city."""

    city: str = Field(max_length=30)
    unit: str = Field(pattern="^(celsius|fahrenheit)$")


def test_langchain_bind_tools_and_function_calling(smollm2_server):
    from langchain_openai import ChatOpenAI

    chat = ChatOpenAI(model=MODEL, base_url=smollm2_server.base_url, api_key="unused", temperature=0, max_tokens=80,
                      max_retries=0)
    bound = chat.bind_tools([Weather], tool_choice="Weather")
    message = bound.invoke("What is the weather in Paris?")
    assert message.tool_calls and message.tool_calls[0]["name"] == "Weather"
    Weather.model_validate(message.tool_calls[0]["args"])
    # Streamed, LangChain joins the call from its chunks (the arguments come in pieces).
    chunks = list(bound.stream("What is the weather in Paris?"))
    joined = sum(chunks[1:], chunks[0])
    assert len([c for c in chunks if c.tool_call_chunks]) > 1
    assert [(call["name"], call["args"]) for call in joined.tool_calls] == [
        (call["name"], call["args"]) for call in message.tool_calls]
    weather = chat.with_structured_output(Weather, method="function_calling").invoke("Weather in Rome, in celsius?")
    assert isinstance(weather, Weather)


def test_openai_agents_on_chat_completions(smollm2_server):
    """openai-agents through its chat-completions model (the one used for servers without the Responses
    API): a typed output (response_format json_schema) and a required tool, streamed and not."""
    import asyncio

    import openai
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, set_tracing_disabled
    from agents_weather import required_weather_agent

    set_tracing_disabled(True)
    calls = []

    async def main():
        client = openai.AsyncOpenAI(base_url=smollm2_server.base_url, api_key="unused", max_retries=0)
        model = OpenAIChatCompletionsModel(model=MODEL, openai_client=client)
        typed = Agent(name="typed", instructions="Answer.", model=model, output_type=Weather,
                      model_settings=ModelSettings(temperature=0, max_tokens=60))
        weather = (await Runner.run(typed, "What is the weather in Paris, in celsius?")).final_output
        tool_user = required_weather_agent(model, calls)
        answer = (await Runner.run(tool_user, "What is the weather in Paris?")).final_output
        streamed = Runner.run_streamed(tool_user, "What is the weather in Rome?")
        async for _ in streamed.stream_events():
            pass
        return weather, answer, streamed.final_output

    weather, answer, streamed_answer = asyncio.run(main())
    assert isinstance(weather, Weather)
    assert len(calls) == 2 and all(isinstance(city, str) for city in calls)
    assert answer == f"Sunny in {calls[0]}" and streamed_answer == f"Sunny in {calls[1]}"
