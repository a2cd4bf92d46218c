"""The body of POST /v1/responses (OpenAI's Responses API, stateless) and its mapping onto a chat request.

A Responses request is a chat request in other clothes: ``instructions`` is a system message put
first, ``input`` one user message or a list of items (messages, the assistant's earlier
``function_call`` items and their ``function_call_output`` results), ``tools`` function tools
written flat, ``text.format`` the response_format, ``max_output_tokens`` max_completion_tokens.
``to_chat_request`` builds that ``ChatCompletionRequest`` so that the chat route's machinery
(chat template, tools, structured outputs, sampling) serves it unchanged.

Nothing is kept between requests. ``previous_response_id``, ``conversation``, ``prompt`` (a stored
prompt), ``background`` and ``store: true`` need server-side state and are refused (400: the issue's
rule; vLLM accepts ``store: true`` and keeps nothing, which a client that reads the response back
finds out later and worse). The official SDK and openai-agents send no ``store`` unless told. The sampling extras of the other routes (top_k, seed, stop, ...) are accepted here too;
unknown fields are ignored with a warning (``reasoning`` among them: no reasoning model is served).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, Tag, ValidationError, field_validator

from aioinfer.entrypoints.openai.errors import APIError, bad_request, from_validation_error
from aioinfer.entrypoints.openai.protocol import ChatCompletionRequest, _SamplingFields
from aioinfer.entrypoints.openai.tool_calls import choice_tag

LOGPROBS_INCLUDE = "message.output_text.logprobs"  # the ``include`` value that asks for logprobs

# vLLM's extras that add to a choice's output, which a response has no place for: refused (check_supported).
_NO_PLACE = ("prompt_logprobs", "return_token_ids")
# The fields a Responses body shares with a chat body, handed on as they are.
_SHARED = frozenset(_SamplingFields.model_fields) - {"stream_options", "n", "stream", *_NO_PLACE}


class FunctionTool(BaseModel):
    # Clients send fields OpenAI added over time (defer_loading, allowed_callers, ...): the ones used are below.
    model_config = ConfigDict(extra="ignore")
    type: Literal["function"]
    name: str
    description: Optional[str] = None
    parameters: Optional[dict[str, Any]] = None
    strict: Optional[bool] = None

    def for_chat(self) -> dict:
        function = self.model_dump(exclude={"type"}, exclude_none=True)
        return {"type": "function", "function": function}


class FunctionChoice(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["function"]
    name: str


class AllowedFunctions(BaseModel):
    """OpenAI's ``{"type": "allowed_tools", "mode": ..., "tools": [{"type": "function", "name": ...}]}``:
    only these functions may be called (the chat route's allowed_tools, tool_calls.py)."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["allowed_tools"]
    mode: Literal["auto", "required"]
    tools: list[FunctionChoice] = Field(min_length=1)

    def for_chat(self) -> dict:
        return {"type": "allowed_tools", "allowed_tools": {
            "mode": self.mode, "tools": [{"type": "function", "function": {"name": tool.name}} for tool in self.tools]}}


# Told apart by ``type``, so that an error names the branch the body meant; the tags are written as
# union branches are ("type[...]"), which errors.py leaves out of the field an error names.
ObjectChoice = Annotated[Union[Annotated[FunctionChoice, Tag("type[function]")],
                               Annotated[AllowedFunctions, Tag("type[allowed_tools]")]],
                         Discriminator(choice_tag)]


def _function_tool_only(tool: Any) -> Any:
    # "type 'web_search' is not supported" rather than pydantic's "Input should be 'function'".
    if isinstance(tool, dict) and tool.get("type") != "function":
        raise ValueError(f"tool type {tool.get('type')!r} is not supported: this server runs function tools only")
    return tool


class TextFormat(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    type: Literal["text", "json_object", "json_schema"]
    name: Optional[str] = None
    description: Optional[str] = None
    schema_: Union[dict[str, Any], bool, None] = Field(default=None, alias="schema")
    strict: Optional[bool] = None

    def as_response_format(self) -> Optional[dict]:
        """The chat route's ``response_format`` for this format; None for plain text."""
        if self.type == "text":
            return None
        if self.type == "json_object":
            return {"type": "json_object"}
        schema = {"name": self.name or "response", "schema": self.schema_, "description": self.description,
                  "strict": self.strict}
        return {"type": "json_schema", "json_schema": {k: v for k, v in schema.items() if v is not None}}


class TextConfig(BaseModel):
    model_config = ConfigDict(extra="ignore")
    format: Optional[TextFormat] = None
    verbosity: Optional[str] = None  # accepted; a small model is not told how verbose to be


class ResponsesRequest(_SamplingFields):
    input: Union[str, list[dict[str, Any]]]  # items checked one by one in chat_messages, for messages that name them
    instructions: Optional[str] = None
    max_output_tokens: Optional[int] = Field(default=None, ge=1)  # None: the rest of the context
    tools: Optional[list[Annotated[FunctionTool, BeforeValidator(_function_tool_only)]]] = None  # [] = none
    tool_choice: Union[Literal["none", "auto", "required"], ObjectChoice, None] = None
    parallel_tool_calls: Optional[bool] = None
    text: Optional[TextConfig] = None
    include: Optional[list[str]] = None  # only LOGPROBS_INCLUDE changes anything: the rest are OpenAI-hosted data
    top_logprobs: Optional[int] = Field(default=None, ge=0, le=20)
    metadata: Optional[dict[str, str]] = None  # echoed back
    # "auto" is accepted: a prompt too long for the context is a 400 either way, never silently cut here.
    truncation: Optional[Literal["auto", "disabled"]] = None
    store: Optional[bool] = None
    # Refused: each needs state this server does not keep (check_supported).
    previous_response_id: Optional[str] = None
    conversation: Any = None
    prompt: Any = None
    background: Optional[bool] = None
    # The Responses API's own stream_options (include_obfuscation): there is no obfuscation to include.
    stream_options: Optional[dict[str, Any]] = None  # type: ignore[assignment]

    @field_validator("input", mode="before")
    @classmethod
    def _input_shape(cls, value):
        if not isinstance(value, (str, list)):
            raise ValueError("input must be a string or a list of input items")
        return value

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _function_choice_only(cls, value):
        # A union's error would name its first branch ("should be 'none', 'auto' or 'required'").
        if isinstance(value, dict) and value.get("type") not in ("function", "allowed_tools"):
            raise ValueError(f"type {value.get('type')!r} is not supported: send 'none', 'auto', 'required', "
                             "{'type': 'function', 'name': ...} or {'type': 'allowed_tools', ...}")
        if isinstance(value, dict) and value.get("type") == "function" and not isinstance(value.get("name"), str):
            raise ValueError("a function tool_choice needs the function's name: {'type': 'function', 'name': ...}")
        return value

    def check_supported(self) -> None:
        """400 for what needs a stored response, and for what a response has no place for (n, ...)."""
        for name, hint in (("previous_response_id", "send the whole conversation in input"),
                           ("conversation", "send the whole conversation in input"),
                           ("prompt", "send the prompt's text as instructions and input")):
            if getattr(self, name) is not None:
                raise bad_request(f"{name} needs stored responses, and this server keeps none: {hint}",
                                  param=name, code="unsupported_parameter")
        if self.background:
            raise bad_request("background needs stored responses, and this server keeps none", param="background",
                              code="unsupported_parameter")
        if self.store:
            raise bad_request("store: true needs stored responses, and this server keeps none: send store: false "
                              "or leave it out", param="store", code="unsupported_parameter")
        if self.n != 1:
            raise bad_request("n is not supported on /v1/responses: a response has one output", param="n",
                              code="unsupported_parameter")
        for name in _NO_PLACE:
            if getattr(self, name, None) not in (None, False):
                raise bad_request(f"{name} is not supported on /v1/responses", param=name,
                                  code="unsupported_parameter")

    @property
    def wants_logprobs(self) -> bool:
        return LOGPROBS_INCLUDE in (self.include or ())

    @property
    def format(self) -> Optional[TextFormat]:
        return self.text.format if self.text is not None else None


def to_chat_request(req: ResponsesRequest) -> ChatCompletionRequest:
    """The chat request that means the same; 400s name the Responses fields."""
    fmt = req.format
    response_format = fmt.as_response_format() if fmt is not None else None
    if response_format is not None and req.response_format is not None:
        raise bad_request("send text.format or response_format, not both", param="text.format")
    body = req.model_dump(include=_SHARED, exclude_unset=True, by_alias=True)
    body.update(messages=chat_messages(req), max_completion_tokens=req.max_output_tokens,
                parallel_tool_calls=req.parallel_tool_calls)
    if response_format is not None:
        body["response_format"] = response_format
    if req.tools:  # [] is what openai-agents sends for an agent without tools
        body["tools"] = [tool.for_chat() for tool in req.tools]
    if isinstance(req.tool_choice, FunctionChoice):
        body["tool_choice"] = {"type": "function", "function": {"name": req.tool_choice.name}}
    elif isinstance(req.tool_choice, AllowedFunctions):
        body["tool_choice"] = req.tool_choice.for_chat()
    elif req.tool_choice is not None:
        body["tool_choice"] = req.tool_choice
    if req.wants_logprobs:
        body.update(logprobs=True, top_logprobs=req.top_logprobs or 0)
    try:
        return ChatCompletionRequest.model_validate(body)
    except ValidationError as exc:  # the fields were checked above: this names a chat field, mapped back
        raise responses_param(from_validation_error(exc)) from None


# Chat fields whose errors (raised by the chat machinery) are about these Responses fields.
_RESPONSES_PARAM = {"messages": "input", "response_format": "text.format", "max_completion_tokens": "max_output_tokens",
                    "max_tokens": "max_output_tokens"}


def responses_param(exc: APIError) -> APIError:
    """The same error, naming the Responses field where it named the chat field."""
    if exc.param is not None and exc.param.startswith("tool_choice.allowed_tools."):
        exc.param = "tool_choice." + exc.param[len("tool_choice.allowed_tools."):]  # a level flatter here
    elif exc.param is not None:
        head, dot, rest = exc.param.partition(".")
        if head in _RESPONSES_PARAM:
            exc.param = _RESPONSES_PARAM[head] + dot + rest
    return exc


# ------------------------------------------------------------------ input items -> chat messages

_ROLES = {"user": "user", "assistant": "assistant", "system": "system",
          # The chat templates of the families served know "system", not "developer" (Qwen2.5's puts its
          # default system prompt before a conversation that does not open with one).
          "developer": "system"}
_TEXT_PARTS = {"input_text": "text", "output_text": "text", "text": "text", "refusal": "refusal"}


def chat_messages(req: ResponsesRequest) -> list[dict]:
    messages: list[dict] = []
    if req.instructions:
        messages.append({"role": "system", "content": req.instructions})
    if isinstance(req.input, str):
        messages.append({"role": "user", "content": req.input})
        return messages
    for index, item in enumerate(req.input):
        where = f"input.{index}"
        kind = item.get("type", "message")  # an easy input message may leave its type out
        if kind == "message":
            messages.append(_message(item, where))
        elif kind == "function_call":
            _add_call(messages, _function_call(item, where))
        elif kind == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": _string(item, "call_id", where),
                             "content": _text(item.get("output"), f"{where}.output")})
        elif kind == "reasoning":
            continue  # an earlier reasoning model's item (no reasoning model is served): nothing to render
        elif kind == "item_reference":
            raise bad_request("an item_reference needs stored items, and this server keeps none: send the item "
                              "itself", param=f"{where}.type", code="unsupported_parameter")
        else:
            raise bad_request(f"input item type {kind!r} is not supported (message, function_call, "
                              "function_call_output)", param=f"{where}.type")
    if not messages:
        raise bad_request("input is empty", param="input")
    return messages


def _message(item: dict, where: str) -> dict:
    role = item.get("role")
    if not isinstance(role, str) or role not in _ROLES:  # a list or object is no role (and unhashable)
        raise bad_request(f"role must be one of {sorted(_ROLES)}, got {role!r}", param=f"{where}.role")
    return {"role": _ROLES[role], "content": _text(item.get("content"), f"{where}.content")}


def _text(content: Any, where: str) -> str:
    """A message's content (or a tool output): a string, or text parts joined with "\\n" (as chat_content)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request("must be a string or a list of content parts", param=where)
    texts = []
    for index, part in enumerate(content):
        here = f"{where}.{index}"
        kind = part.get("type") if isinstance(part, dict) else None
        if not isinstance(kind, str) or kind not in _TEXT_PARTS:
            raise bad_request(f"content part type {kind!r} is not supported: this model takes text only (send "
                              "input_text parts)", param=f"{here}.type")
        texts.append(_string(part, _TEXT_PARTS[kind], here))
    return "\n".join(texts)


def _function_call(item: dict, where: str) -> dict:
    arguments = _string(item, "arguments", where)
    try:
        json.loads(arguments)
    except ValueError:
        raise bad_request("the arguments of a function_call must be JSON", param=f"{where}.arguments") from None
    return {"id": _string(item, "call_id", where), "type": "function",
            "function": {"name": _string(item, "name", where), "arguments": arguments}}


def _add_call(messages: list[dict], call: dict) -> None:
    # A response's message and its calls (or several calls) are one assistant turn of the chat history.
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "assistant":
        last.setdefault("tool_calls", []).append(call)
    else:
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})


def _string(item: dict, key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise bad_request(f"{key} must be a string", param=f"{where}.{key}")
    return value
