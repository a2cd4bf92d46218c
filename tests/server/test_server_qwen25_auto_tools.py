"""``tool_choice="auto"`` with a real instruct model that writes tool calls (Qwen2.5-Coder-0.5B-Instruct,
its GGUF on the CPU): the server parses the model's own ``<tool_call>`` into ``tool_calls`` for the openai
client (streamed and not), LangChain's ``bind_tools`` and openai-agents. Nothing constrains the output
here: the calls are the model's, read out of its text as a vLLM server with the hermes parser would.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from server_process import start_server

WEATHER = {"type": "object", "required": ["city"], "properties": {"city": {"type": "string"}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather of a city",
                                           "parameters": WEATHER}}]
ASK = [{"role": "user", "content": "What is the weather in Paris right now?"}]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(qwen25_coder_gguf):
    proc = start_server({"AIOINFER_MODEL": str(qwen25_coder_gguf), "AIOINFER_DEVICE": "cpu",
                         "AIOINFER_DTYPE": "float32", "AIOINFER_MAX_MODEL_LEN": "2048"})
    yield proc
    assert proc.stop() == 0, proc.output()
    proc.close_log()


def _model(server) -> str:
    import httpx

    return httpx.get(server.base_url + "/models", timeout=10).json()["data"][0]["id"]


def test_openai_client_gets_the_models_own_call(server):
    from openai import OpenAI

    client = OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
    args = dict(model=_model(server), messages=ASK, tools=TOOLS, tool_choice="auto", temperature=0, max_tokens=60)
    choice = client.chat.completions.create(**args).choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert [c.function.name for c in choice.message.tool_calls] == ["get_weather"]
    assert json.loads(choice.message.tool_calls[0].function.arguments) == {"city": "Paris"}
    assert "<tool_call>" not in (choice.message.content or "")

    names, arguments, content, finish = "", "", "", None
    for chunk in client.chat.completions.create(stream=True, **args):
        for c in chunk.choices:
            content += c.delta.content or ""
            for call in c.delta.tool_calls or ():
                names += call.function.name or ""
                arguments += call.function.arguments or ""
            finish = c.finish_reason or finish
    assert (names, json.loads(arguments), finish) == ("get_weather", {"city": "Paris"}, "tool_calls")
    assert "<tool_call>" not in content


def test_langchain_bind_tools_auto(server):
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def get_weather(city: str) -> str:
        """Current weather of a city."""
        return f"Sunny in {city}"

    chat = ChatOpenAI(model=_model(server), base_url=server.base_url, api_key="unused", temperature=0,
                      max_tokens=60, max_retries=0)
    message = chat.bind_tools([get_weather]).invoke("What is the weather in Paris right now?")
    assert [(c["name"], c["args"]) for c in message.tool_calls] == [("get_weather", {"city": "Paris"})], message


def test_openai_agents_calls_the_tool_on_its_own(server):
    import openai
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)
    calls = []

    @function_tool
    def get_weather(city: str) -> str:
        """Current weather of a city."""
        calls.append(city)
        return f"Sunny in {city}"

    async def main():
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
        # No instructions: Qwen2.5's template then keeps its own system prompt, under which this 0.5B model
        # writes its calls in <tool_call> tags; under "Use the tools." it wrote the bare JSON (as text: a
        # vLLM server's hermes parser, reading the same greedy text, would not see a call either).
        agent = Agent(name="weather", tools=[get_weather],
                      model=OpenAIChatCompletionsModel(model=_model(server), openai_client=client),
                      tool_use_behavior="stop_on_first_tool",  # tool_choice stays "auto": the model decides
                      model_settings=ModelSettings(temperature=0, max_tokens=60))
        return (await Runner.run(agent, "What is the weather in Paris right now?")).final_output

    answer = asyncio.run(main())
    assert calls == ["Paris"] and answer == "Sunny in Paris", answer
