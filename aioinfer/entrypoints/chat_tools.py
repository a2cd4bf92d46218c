"""Tools in a chat prompt, shared by the offline ``LLM.chat`` and the server (no pydantic here).

The chat template renders ``tools`` when it knows how (Qwen2.5's, in the hermes format); one that
ignores them (SmolLM2's GGUF template) gets them as a system message in the same format, and
earlier calls in the history as the ``<tool_call>`` text the model is told to write.
"""

from __future__ import annotations

import json
from typing import Optional


def hermes_system_prompt(tools: list[dict]) -> str:
    """The tool instructions Qwen2.5's template writes, for templates that ignore ``tools``."""
    listed = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
    return ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
            f"{listed}\n</tools>\n\nFor each function call, return a json object with function name and "
            "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
            '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')


def calls_as_text(tool_calls: list[dict]) -> str:
    return "\n".join("<tool_call>\n" + json.dumps({"name": c["function"]["name"], "arguments": c["function"]["arguments"]},
                                                  ensure_ascii=False) + "\n</tool_call>" for c in tool_calls)


def tools_in_system_message(conversation: list[dict], tools: list[dict]) -> list[dict]:
    """For a template without tool support: the hermes instructions in the system message, earlier
    calls as the ``<tool_call>`` text the model is told to write."""
    instructions = hermes_system_prompt(tools)
    out = []
    for message in conversation:
        if message.get("tool_calls"):
            text = calls_as_text(message["tool_calls"])
            message = {"role": message["role"], "content": (message["content"] + "\n" + text).strip()}
        out.append(message)
    if out and out[0]["role"] == "system":
        out[0] = {**out[0], "content": out[0]["content"] + "\n\n" + instructions}
    else:
        out.insert(0, {"role": "system", "content": instructions})
    return out


def render_with_tools(tokenizer, conversation: list[dict], tools: Optional[list[dict]], **template_kwargs) -> str:
    """The chat template's text with the tools; a template that ignores them (renders the same text
    without) gets them through ``tools_in_system_message``."""
    def render(conv: list[dict], with_tools: Optional[list[dict]]) -> str:
        return tokenizer.apply_chat_template(conv, tools=with_tools, tokenize=False, **template_kwargs)

    text = render(conversation, tools)
    if tools and text == render(conversation, None):
        text = render(tools_in_system_message(conversation, tools), None)
    return text
