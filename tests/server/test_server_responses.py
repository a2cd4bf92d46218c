"""POST /v1/responses (stateless) with the real openai client and openai-agents, on the real SmolLM2 server.

Each answer is checked against /v1/chat/completions on the equivalent messages: the Responses route
is the chat route's machinery with another shape, so the text (greedy) and the token counts must match.
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from server_process import metric, metric_samples

MODEL = "SmolLM2-135M-Instruct"
HELLO = "Say hello."
WEATHER = {"type": "object", "additionalProperties": False, "required": ["city"],
           "properties": {"city": {"type": "string", "maxLength": 20}}}
TOOL = {"type": "function", "name": "get_weather", "description": "Current weather of a city", "parameters": WEATHER,
        "strict": True}
PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string", "maxLength": 20},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120}}}
ABOUT_ALICE = "Alice Smith is 34 years old and lives in Paris. Give her name and age as a JSON object."


def _chat(client, messages, **args):
    return client.chat.completions.create(model=MODEL, messages=messages, temperature=0, **args)


def test_text_answer_streamed_and_not(smollm2_client):
    response = smollm2_client.responses.create(model=MODEL, input=HELLO, max_output_tokens=8, temperature=0)
    chat = _chat(smollm2_client, [{"role": "user", "content": HELLO}], max_tokens=8)
    assert response.id.startswith("resp_") and response.object == "response" and response.model == MODEL
    assert response.output_text and response.output_text == chat.choices[0].message.content
    [message] = response.output
    assert message.type == "message" and message.role == "assistant" and message.id.startswith("msg_")
    assert message.content[0].type == "output_text" and message.content[0].annotations == []
    usage = response.usage
    assert usage.input_tokens == chat.usage.prompt_tokens and usage.output_tokens == chat.usage.completion_tokens
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens and usage.output_tokens <= 8
    assert usage.output_tokens_details.reasoning_tokens == 0
    if chat.choices[0].finish_reason == "length":
        assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    else:
        assert response.status == "completed" and response.incomplete_details is None
    assert response.max_output_tokens == 8 and response.temperature == 0 and response.tools == []

    events = list(smollm2_client.responses.create(model=MODEL, input=HELLO, max_output_tokens=8, temperature=0,
                                                  stream=True))
    kinds = [e.type for e in events]
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    terminal = "response.incomplete" if response.status == "incomplete" else "response.completed"
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added", *["response.output_text.delta"] * len(deltas),
                     "response.output_text.done", "response.content_part.done", "response.output_item.done", terminal]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    final = events[-1].response
    text = "".join(d.delta for d in deltas)
    assert text == events[-4].text == final.output_text == response.output_text
    item_id = events[2].item.id
    assert all(d.item_id == item_id and d.output_index == 0 for d in deltas) and final.output[0].id == item_id
    assert final.usage.output_tokens == usage.output_tokens and final.id == events[0].response.id


def test_instructions_and_a_tool_call_history(smollm2_client):
    """instructions + input items (text parts, a function_call and its output) = the chat history."""
    items = [{"role": "user", "content": [{"type": "input_text", "text": "What is the weather in Paris?"}]},
             {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
             {"type": "function_call_output", "call_id": "call_1", "output": "Sunny, 24 C"}]
    response = smollm2_client.responses.create(model=MODEL, instructions="Answer in one sentence.", input=items,
                                               tools=[TOOL], tool_choice="none", max_output_tokens=16, temperature=0)
    messages = [{"role": "system", "content": "Answer in one sentence."},
                {"role": "user", "content": "What is the weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 24 C"}]
    chat = _chat(smollm2_client, messages, max_tokens=16, tools=[{"type": "function", "function": {
        k: v for k, v in TOOL.items() if k != "type"}}], tool_choice="none")
    assert response.output_text == chat.choices[0].message.content and response.output_text
    assert response.usage.input_tokens == chat.usage.prompt_tokens
    assert response.instructions == "Answer in one sentence." and response.tool_choice == "none"


def test_text_beside_tools_streams_as_written(smollm2_client):
    """With tools, a text answer's deltas come as it is written (not all at the end) and add up to the unstreamed answer."""
    args = dict(model=MODEL, input="Say hello to me in one sentence.", tools=[TOOL], max_output_tokens=40,
                temperature=0)
    response = smollm2_client.responses.create(**args)
    assert response.output_text and [item.type for item in response.output] == ["message"]
    events = list(smollm2_client.responses.create(stream=True, **args))
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) > 3 and "".join(deltas) == response.output_text == events[-1].response.output_text
    assert [e.sequence_number for e in events] == list(range(len(events)))


@pytest.mark.parametrize("stream", [False, True])
def test_required_function_tool(smollm2_client, stream):
    args = dict(model=MODEL, input="What is the weather in Paris?", tools=[TOOL], tool_choice="required",
                parallel_tool_calls=False, max_output_tokens=60, temperature=0)
    if stream:
        events = list(smollm2_client.responses.create(stream=True, **args))
        kinds = [e.type for e in events]
        assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.function_call_arguments.delta", "response.function_call_arguments.done",
                         "response.output_item.done", "response.completed"]
        assert [e.sequence_number for e in events] == list(range(len(events)))
        assert events[2].item.arguments == "" and events[3].delta == events[4].arguments
        response = events[-1].response
        assert response.output[0].model_dump() == events[5].item.model_dump()
    else:
        response = smollm2_client.responses.create(**args)
    assert response.status == "completed" and response.output_text == ""
    [call] = response.output
    assert call.type == "function_call" and call.name == "get_weather" and call.status == "completed"
    assert call.call_id.startswith("call_") and call.id.startswith("fc_")
    jsonschema.validate(json.loads(call.arguments), WEATHER)


def test_a_named_functions_arguments_stream_as_written(smollm2_client):
    """A named function's call is opened at once and its arguments sent as the model writes them, as
    OpenAI streams them (not whole at the end); the SDK's
    stream helper joins them into the unstreamed call."""
    args = dict(model=MODEL, input="What is the weather in Paris?", tools=[TOOL], max_output_tokens=40,
                tool_choice={"type": "function", "name": "get_weather"}, temperature=0)
    [call] = smollm2_client.responses.create(**args).output
    with smollm2_client.responses.stream(**args) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                     *["response.function_call_arguments.delta"] * len(deltas),
                     "response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    assert len(deltas) > 3 and "".join(deltas) == call.arguments == final.output[0].arguments
    assert events[2].item.name == "get_weather" and events[2].item.status == "in_progress"
    assert final.output[0].status == "completed" and final.output[0].id == events[2].item.id
    jsonschema.validate(json.loads(call.arguments), WEATHER)


def test_langchain_on_the_responses_api(smollm2_server):
    """LangChain's ChatOpenAI through the Responses API: a named tool's call, and streamed, the call
    joined from its argument pieces into the same call."""
    from langchain_openai import ChatOpenAI

    class Weather(BaseModel):
        """Current weather of a city"""

        city: str = Field(max_length=20)

    chat = ChatOpenAI(model=MODEL, base_url=smollm2_server.base_url, api_key="unused", temperature=0,
                      max_tokens=40, max_retries=0, use_responses_api=True)
    bound = chat.bind_tools([Weather], tool_choice="Weather")
    message = bound.invoke("What is the weather in Paris?")
    assert [call["name"] for call in message.tool_calls] == ["Weather"]
    Weather.model_validate(message.tool_calls[0]["args"])
    chunks = list(bound.stream("What is the weather in Paris?"))
    joined = sum(chunks[1:], chunks[0])
    pieces = [piece["args"] for c in chunks for piece in c.tool_call_chunks if piece.get("args")]
    assert len(pieces) > 3  # the arguments as they were written, not in one piece
    assert [(call["name"], call["args"]) for call in joined.tool_calls] == [
        (call["name"], call["args"]) for call in message.tool_calls]


def test_allowed_tools_tool_choice(smollm2_server, smollm2_client):
    """The Responses form of allowed_tools ({"type": "allowed_tools", "mode", "tools": [{"type":
    "function", "name"}]}): only the listed function is called, and the choice is echoed back."""
    time_tool = {"type": "function", "name": "get_time", "description": "Current time in a timezone",
                 "parameters": {"type": "object", "additionalProperties": False, "required": ["timezone"],
                                "properties": {"timezone": {"type": "string", "maxLength": 40}}}}
    choice = {"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "get_time"}]}
    response = smollm2_client.responses.create(model=MODEL, input="What is the weather in Paris?",
                                               tools=[TOOL, time_tool], tool_choice=choice, max_output_tokens=60,
                                               parallel_tool_calls=False, temperature=0)
    [call] = response.output
    assert call.type == "function_call" and call.name == "get_time"
    jsonschema.validate(json.loads(call.arguments), time_tool["parameters"])
    assert response.tool_choice.model_dump(exclude_none=True) == choice
    unknown = dict(choice, tools=[{"type": "function", "name": "nope"}])
    response = httpx.post(smollm2_server.base_url + "/responses", timeout=60,
                          json={"model": MODEL, "input": "hi", "tools": [TOOL], "tool_choice": unknown})
    assert response.status_code == 400 and response.json()["error"]["param"] == "tool_choice.tools", response.text


class Person(BaseModel):
    name: str = Field(max_length=20)
    age: int = Field(ge=0, le=120)


def test_text_format_json_schema(smollm2_client):
    response = smollm2_client.responses.create(
        model=MODEL, input=ABOUT_ALICE, max_output_tokens=80, temperature=0,
        text={"format": {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}})
    assert response.status == "completed"
    jsonschema.validate(json.loads(response.output_text), PERSON)
    assert response.text.format.type == "json_schema" and response.text.format.name == "person"
    parsed = smollm2_client.responses.parse(model=MODEL, input=ABOUT_ALICE, text_format=Person,
                                            max_output_tokens=80, temperature=0)
    assert isinstance(parsed.output_parsed, Person)


def test_stateful_fields_are_refused_and_bad_input_named(smollm2_server, smollm2_client):
    with pytest.raises(openai.BadRequestError) as caught:
        smollm2_client.responses.create(model=MODEL, input=HELLO, previous_response_id="resp_123")
    assert caught.value.body["param"] == "previous_response_id"
    assert caught.value.body["code"] == "unsupported_parameter"
    with pytest.raises(openai.BadRequestError) as caught:
        smollm2_client.responses.create(model=MODEL, input=HELLO, background=True)
    assert caught.value.body["param"] == "background"
    bad = [({"input": 5}, "input"),
           ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input.0.content.0.type"),
           ({"input": HELLO, "tools": [{"type": "web_search"}]}, "tools.0"),
           ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{"}]}, "input.0.arguments")]
    for body, param in bad:
        answer = httpx.post(smollm2_server.base_url + "/responses", json={"model": MODEL, **body}, timeout=30)
        assert answer.status_code == 400 and answer.json()["error"]["param"] == param, (body, answer.text)
    # Nothing is stored: store: true is refused, store: false answered (and said so).
    answer = httpx.post(smollm2_server.base_url + "/responses", timeout=30, json={
        "model": MODEL, "input": HELLO, "store": True, "max_output_tokens": 1})
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "store", answer.text
    answer = httpx.post(smollm2_server.base_url + "/responses", timeout=30, json={
        "model": MODEL, "input": HELLO, "store": False, "max_output_tokens": 1, "include": []})
    assert answer.status_code == 200 and answer.json()["store"] is False
    assert "X-Aioinfer-Ignored-Fields" not in answer.headers


def test_client_leaving_a_stream_aborts_the_request(smollm2_server, smollm2_client):
    before = metric(metric_samples(smollm2_server), "aioinfer:requests_aborted_total", cause="client")
    with smollm2_client.responses.create(model=MODEL, input="Write a long story about a dragon.",
                                         max_output_tokens=1500, temperature=0, stream=True) as stream:
        for event in stream:
            if event.type == "response.output_text.delta":
                break
    deadline = time.monotonic() + 60  # a bound for a stuck server, not a timing assumption
    while True:  # the gauge follows the abort at the next step: both are waited for
        samples = metric_samples(smollm2_server)
        if (metric(samples, "aioinfer:requests_aborted_total", cause="client") == before + 1
                and metric(samples, "vllm:num_requests_running") == 0):
            break
        assert time.monotonic() < deadline, "the engine request was not aborted"
        time.sleep(0.1)


# ------------------------------------------------------------------ openai-agents' default model

def test_openai_agents(smollm2_server):
    from agents import (Agent, ModelSettings, OpenAIResponsesModel, Runner, set_default_openai_client,
                        set_tracing_disabled)
    from agents_weather import required_weather_agent

    set_tracing_disabled(True)
    calls = []

    async def main():
        client = openai.AsyncOpenAI(base_url=smollm2_server.base_url, api_key="unused", max_retries=0)
        model = OpenAIResponsesModel(model=MODEL, openai_client=client)
        plain = Agent(name="assistant", instructions="Answer in one short sentence.", model=model,
                      model_settings=ModelSettings(temperature=0, max_tokens=16))
        answer = await Runner.run(plain, "What is the capital of France?")
        weather = required_weather_agent(model, calls)
        tool_answer = await Runner.run(weather, "What is the weather in Paris?")
        # Streamed: the call's item arrives while the response streams (responses_items.py).
        streamed = Runner.run_streamed(required_weather_agent(model, streamed_calls), "What is the weather in Paris?")
        kinds = [event.type async for event in streamed.stream_events()]
        assert "raw_response_event" in kinds and "run_item_stream_event" in kinds
        streamed_answer = streamed.final_output
        # The default model: an Agent given only a model name, the SDK's default client set to this
        # server (its default provider then serves the name through the Responses API).
        set_default_openai_client(client, use_for_tracing=False)
        by_default = Agent(name="assistant", instructions="Answer in one short sentence.", model=MODEL,
                           model_settings=ModelSettings(temperature=0, max_tokens=16))
        default_answer = await Runner.run(by_default, "What is the capital of France?")
        return answer.final_output, tool_answer.final_output, default_answer.final_output, streamed_answer

    streamed_calls = []
    text, tool_text, default_text, streamed_text = asyncio.run(main())
    assert isinstance(text, str) and text.strip()
    assert default_text == text  # the same route, greedy
    assert len(calls) == 1 and isinstance(calls[0], str) and tool_text == f"Sunny in {calls[0]}"
    assert streamed_calls == calls and streamed_text == tool_text


def test_logprobs_when_included(smollm2_client):
    response = smollm2_client.responses.create(model=MODEL, input=HELLO, max_output_tokens=4, temperature=0,
                                               include=["message.output_text.logprobs"], top_logprobs=2)
    chat = _chat(smollm2_client, [{"role": "user", "content": HELLO}], max_tokens=4, logprobs=True, top_logprobs=2)
    got, want = response.output[0].content[0].logprobs, chat.choices[0].logprobs.content
    assert len(got) == len(want) == 4
    for mine, theirs in zip(got, want):  # equal up to float noise (the second prompt hits the prefix cache)
        assert mine.token == theirs.token and mine.bytes == theirs.bytes
        assert mine.logprob == pytest.approx(theirs.logprob, abs=1e-4)
        assert [t.token for t in mine.top_logprobs] == [t.token for t in theirs.top_logprobs]


# ------------------------------------------------------------------ in-band errors (no server)

def test_an_error_after_the_stream_began_is_an_error_event():
    from aioinfer.engine.delta import GenerationDelta
    from aioinfer.entrypoints.openai.responses_protocol import ResponsesRequest
    from aioinfer.entrypoints.openai.serving_responses import _ResponseJob
    from aioinfer.errors import EngineDeadError
    from aioinfer.sampling_params import SamplingParams

    class DyingStreams:
        shut_down, closed = False, False

        async def merged(self):
            yield None, GenerationDelta(request_id="r", token_ids=[1], text="Hi", logprobs=None)
            raise EngineDeadError("the GPU thread died")

        async def close(self):
            self.closed = True

    async def main(streams):
        job = _ResponseJob(ResponsesRequest.model_validate({"input": "x"}), "resp_1", MODEL, SamplingParams(), 3,
                           plan=None)
        return [json.loads(chunk.split(b"data: ", 1)[1]) async for chunk in job.stream(streams)]

    streams = DyingStreams()
    events = asyncio.run(main(streams))
    assert [e["type"] for e in events] == ["response.created", "response.in_progress", "response.output_item.added",
                                           "response.content_part.added", "response.output_text.delta", "error"]
    assert events[-1]["code"] == "engine_dead" and events[-1]["sequence_number"] == 5 and streams.closed
