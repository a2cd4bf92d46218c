"""openai-agents' weather agent, shared by the tests of its two models (Responses, chat completions)."""

from __future__ import annotations


def required_weather_agent(model, calls: list):
    """An agent that must call ``get_weather`` (which appends its city to ``calls``) and stops on that
    first call, its result the answer: the run is bounded whatever the model writes."""
    from agents import Agent, ModelSettings, function_tool

    @function_tool
    def get_weather(city: str) -> str:
        """Current weather of a city."""
        calls.append(city)
        return f"Sunny in {city}"

    return Agent(name="weather", instructions="Use the tools.", model=model, tools=[get_weather],
                 tool_use_behavior="stop_on_first_tool",
                 model_settings=ModelSettings(temperature=0, max_tokens=40, tool_choice="required"))
