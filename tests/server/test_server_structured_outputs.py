"""Structured outputs over HTTP with the real openai client: ``chat.completions.parse`` with a pydantic
model, ``response_format`` json_object and json_schema (streamed and not), vLLM's extras, and a 400
naming the field for a schema that does not compile; then LangChain, LiteLLM, instructor and
pydantic-ai."""

from __future__ import annotations

import json
import re

import httpx
import jsonschema
import pytest
from openai import BadRequestError
from pydantic import BaseModel, Field

MODEL = "SmolLM2-135M-Instruct"
TEXT = "Alice Smith is 34 years old and lives in Paris."
PERSON_SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
                 "properties": {"name": {"type": "string", "maxLength": 20},
                                "age": {"type": "integer", "minimum": 0, "maximum": 120}}}


class Person(BaseModel):
    name: str = Field(max_length=20)
    age: int = Field(ge=0, le=120)
    city: str = Field(max_length=20)


def _messages(content: str) -> list[dict]:
    return [{"role": "user", "content": content}]


def test_parse_with_a_pydantic_model(smollm2_client):
    completion = smollm2_client.chat.completions.parse(model=MODEL, messages=_messages(TEXT + " Give her as JSON."),
                                               response_format=Person, temperature=0, max_tokens=80)
    message = completion.choices[0].message
    assert completion.choices[0].finish_reason == "stop"
    assert isinstance(message.parsed, Person) and 0 <= message.parsed.age <= 120
    assert Person.model_validate_json(message.content) == message.parsed


def test_sdk_stream_helper_and_strict_function_tool(smollm2_client):
    """The SDK's other typed helpers: ``chat.completions.stream(response_format=Model)`` (its final
    message parsed from the chunks) and ``pydantic_function_tool`` (a strict tool whose arguments
    ``parse`` validates)."""
    import openai

    prompt = _messages(TEXT + " Give her as JSON.")
    with smollm2_client.chat.completions.stream(model=MODEL, messages=prompt, response_format=Person,
                                                temperature=0, max_tokens=80) as stream:
        for _ in stream:
            pass
        streamed = stream.get_final_completion().choices[0].message.parsed
    assert streamed == smollm2_client.chat.completions.parse(model=MODEL, messages=prompt, response_format=Person,
                                                             temperature=0, max_tokens=80).choices[0].message.parsed
    tool = openai.pydantic_function_tool(Person)
    assert tool["function"]["strict"] is True
    completion = smollm2_client.chat.completions.parse(model=MODEL, messages=_messages(TEXT), tools=[tool],
                                                       tool_choice="required", temperature=0, max_tokens=80)
    call = completion.choices[0].message.tool_calls[0]
    assert call.function.name == "Person" and isinstance(call.function.parsed_arguments, Person)
    # The stream helper joins a named call's arguments from the pieces they are streamed in.
    named = {"type": "function", "function": {"name": "Person"}}
    with smollm2_client.chat.completions.stream(model=MODEL, messages=_messages(TEXT), tools=[tool], tool_choice=named,
                                                temperature=0, max_tokens=80) as stream:
        pieces = [event for event in stream if event.type == "tool_calls.function.arguments.delta"]
        [streamed] = stream.get_final_completion().choices[0].message.tool_calls
    assert len(pieces) > 1 and isinstance(streamed.function.parsed_arguments, Person)
    [plain] = smollm2_client.chat.completions.parse(model=MODEL, messages=_messages(TEXT), tools=[tool],
                                                    tool_choice=named, temperature=0, max_tokens=80).choices[0].message.tool_calls
    assert streamed.function.parsed_arguments == plain.function.parsed_arguments


@pytest.mark.parametrize("stream", [False, True])
def test_response_format_json_schema_and_json_object(smollm2_client, stream):
    formats = [{"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON_SCHEMA, "strict": True}},
               {"type": "json_object"}]
    for response_format in formats:
        args = dict(model=MODEL, messages=_messages(TEXT + " Give her name and age as a JSON object."),
                    temperature=0, max_tokens=120,
                    response_format=response_format)
        if stream:
            chunks = list(smollm2_client.chat.completions.create(stream=True, **args))
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
            assert finish == ["stop"]
            assert text == smollm2_client.chat.completions.create(**args).choices[0].message.content  # same as not streamed
        else:
            text = smollm2_client.chat.completions.create(**args).choices[0].message.content
        value = json.loads(text)
        assert isinstance(value, dict)
        if response_format["type"] == "json_schema":
            jsonschema.validate(value, PERSON_SCHEMA)


def test_vllm_extras_on_chat_and_completions(smollm2_client):
    choice = smollm2_client.chat.completions.create(model=MODEL, messages=_messages("Is Paris in France?"), temperature=0,
                                            max_tokens=8, extra_body={"guided_choice": ["yes", "no"]})
    assert choice.choices[0].message.content in ("yes", "no")
    regex = r"\d{3}-\d{4}"
    completion = smollm2_client.completions.create(model=MODEL, prompt="Call me at ", max_tokens=12, temperature=0.8, seed=2,
                                           extra_body={"structured_outputs": {"regex": regex}})
    assert re.fullmatch(regex, completion.choices[0].text)
    schema = smollm2_client.completions.create(model=MODEL, prompt=TEXT + " As JSON:", max_tokens=60, temperature=0,
                                       extra_body={"guided_json": PERSON_SCHEMA})
    jsonschema.validate(json.loads(schema.choices[0].text), PERSON_SCHEMA)


@pytest.mark.parametrize("stream", [False, True])
def test_structural_tag_response_format(smollm2_client, stream):
    """vLLM's structural tag: free text until a trigger, then the begin, JSON matching the schema, the
    end. The trigger is the first word of the model's own unconstrained answer, so it is met."""
    messages = _messages("What is the weather like in Paris today?")
    free = smollm2_client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=8)
    trigger = free.choices[0].message.content.split()[0]
    schema = {"type": "object", "required": ["city"], "additionalProperties": False,
              "properties": {"city": {"type": "string", "maxLength": 30}}}
    tag = {"type": "structural_tag", "triggers": [trigger],
           "structures": [{"begin": trigger + " <weather>", "schema": schema, "end": "</weather>"}]}
    args = dict(model=MODEL, messages=messages, temperature=0, max_tokens=80, response_format=tag)
    if stream:
        chunks = list(smollm2_client.chat.completions.create(stream=True, **args))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    else:
        text = smollm2_client.chat.completions.create(**args).choices[0].message.content
    body, end, _ = text.partition(trigger + " <weather>")[2].partition("</weather>")
    assert end, text
    jsonschema.validate(json.loads(body), schema)
    # vLLM's structured_outputs form (the tag as a JSON string) gives the same text.
    tag_only = {k: v for k, v in tag.items() if k != "type"}
    same = smollm2_client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=80,
                                                  extra_body={"structured_outputs": {"structural_tag": json.dumps(tag_only)}})
    assert same.choices[0].message.content == text


def test_bad_constraints_are_400s_naming_the_field(smollm2_client, smollm2_server):
    with pytest.raises(BadRequestError) as info:
        smollm2_client.chat.completions.create(model=MODEL, messages=_messages("hi"), max_tokens=4,
                                       response_format={"type": "json_schema",
                                                        "json_schema": {"name": "x", "schema": {"type": "nonsense"}}})
    assert "invalid JSON schema" in info.value.message
    cases = [({"guided_regex": "a(b"}, "invalid regex", None),
             ({"guided_regex": "a+", "guided_choice": ["a"]}, "not several", "guided_choice"),
             ({"structured_outputs": {"regex": "a", "color": 1}}, "color", "structured_outputs"),
             ({"response_format": {"type": "xml"}}, "response_format", None),
             ({"response_format": {"type": "structural_tag", "triggers": ["<f"],
                                   "structures": [{"begin": "<g>", "schema": {}, "end": ""}]}},
              "none of the triggers", "response_format"),
             ({"response_format": {"type": "structural_tag", "format": {"type": "const_string", "value": "a"}}},
              "not supported yet", "response_format")]
    for extra, message, param in cases:
        response = httpx.post(smollm2_server.base_url + "/chat/completions", timeout=60,
                              json={"model": MODEL, "messages": _messages("hi"), "max_tokens": 4, **extra})
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert message in error["message"], error
        if param is not None:
            assert error["param"] == param
    # The server still answers afterwards (nothing was queued or leaked by the failures).
    ok = smollm2_client.chat.completions.create(model=MODEL, messages=_messages("hi"), max_tokens=2, temperature=0)
    assert ok.choices[0].finish_reason in ("stop", "length")


def test_langchain_with_structured_output(smollm2_server):
    from langchain_openai import ChatOpenAI

    chat = ChatOpenAI(model=MODEL, base_url=smollm2_server.base_url, api_key="unused", temperature=0, max_tokens=120,
                      max_retries=0)
    prompt = TEXT + " Give her name, age and city as a JSON object."
    person = chat.with_structured_output(Person, method="json_schema").invoke(prompt)
    assert isinstance(person, Person) and 0 <= person.age <= 120
    # json_mode: the model decides the keys; the output is a parsed JSON object.
    value = chat.with_structured_output(None, method="json_mode").invoke(prompt)
    assert isinstance(value, dict)


def test_litellm_response_format(smollm2_server, monkeypatch):
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network here: the bundled model map
    import litellm

    response = litellm.completion(model=f"openai/{MODEL}", api_base=smollm2_server.base_url, api_key="unused",
                                  messages=_messages(TEXT + " Give her name and age as a JSON object."),
                                  temperature=0, max_tokens=120, num_retries=0,
                                  response_format={"type": "json_schema",
                                                   "json_schema": {"name": "person", "schema": PERSON_SCHEMA}})
    jsonschema.validate(json.loads(response.choices[0].message.content), PERSON_SCHEMA)


@pytest.mark.parametrize("mode", ["TOOLS", "JSON_SCHEMA"])
def test_instructor_modes(smollm2_server, mode):
    """instructor's two OpenAI-native modes: TOOLS (a named tool_choice, constrained to the model's
    schema) and JSON_SCHEMA (response_format json_schema); the pydantic object comes back validated."""
    # Its own extra: installing it downgrades the openai SDK (pyproject.toml says why).
    instructor = pytest.importorskip("instructor", reason="pip install -e '.[test,instructor]'")
    from openai import OpenAI

    client = instructor.from_openai(OpenAI(base_url=smollm2_server.base_url, api_key="unused", max_retries=0),
                                    mode=getattr(instructor.Mode, mode))
    person = client.chat.completions.create(model=MODEL, response_model=Person, max_retries=0, temperature=0,
                                            max_tokens=120,
                                            messages=_messages(TEXT + " Give her name, age and city."))
    assert isinstance(person, Person) and 0 <= person.age <= 120 and person.name


def test_pydantic_ai_typed_outputs(smollm2_server):
    """pydantic-ai's agents on chat completions: the default tool output (a required tool whose arguments
    are the model's schema), NativeOutput (response_format json_schema), each streamed and not, and an
    agent with a tool of its own beside the output; every result comes back validated by pydantic-ai."""
    import asyncio

    from pydantic_ai import Agent, NativeOutput
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider
    from pydantic_ai.settings import ModelSettings

    model = OpenAIChatModel(MODEL, provider=OpenAIProvider(base_url=smollm2_server.base_url, api_key="unused"))
    settings = ModelSettings(temperature=0, max_tokens=120)
    prompt = TEXT + " Give her name, age and city."

    async def streamed(agent):
        async with agent.run_stream(prompt) as result:
            return await result.get_output()

    for output_type in (Person, NativeOutput(Person)):
        agent = Agent(model, output_type=output_type, model_settings=settings, retries=0)
        person = agent.run_sync(prompt).output
        assert isinstance(person, Person) and 0 <= person.age <= 120
        assert asyncio.run(streamed(agent)) == person  # the same greedy request, streamed
    with_tool = Agent(model, output_type=Person, model_settings=settings, retries=0)

    @with_tool.tool_plain
    def home_city(name: str) -> str:
        """The city a person lives in."""
        return "Paris"

    assert isinstance(with_tool.run_sync(prompt).output, Person)
