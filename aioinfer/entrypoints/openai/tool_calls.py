"""Tool calling on /v1/chat/completions: ``tools``, ``tool_choice``, ``parallel_tool_calls``.

- ``tool_choice`` "none": the tools are shown to the model (its chat template renders them) and its
  text is returned as text.
- "auto" (the default when tools are given): the model decides; calls written in the hermes format
  that Qwen2.5's template teaches (``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``)
  are parsed into ``message.tool_calls``, the rest of the text stays ``content``; a reply that is
  only such a call's JSON, without the tags (or in a markdown code fence), is a call too. With
  ``parallel_tool_calls`` false only the first call is kept (vLLM's rule). With the server's
  ``--enforce-strict-tools`` the calls to ``strict`` functions are also held to their schemas
  (``strict_calls``: a structural tag triggered by ``<tool_call>``).
- "required" and a named function: the output is constrained by a JSON schema (structured
  outputs), so the call always parses and its arguments validate against the function's
  parameters: for "required" a list of ``{"name", "parameters"}`` objects (one when
  ``parallel_tool_calls`` is false), for a named function its arguments object itself (vLLM's way).
- OpenAI's ``{"type": "allowed_tools", "allowed_tools": {"mode": "auto" | "required", "tools":
  [{"type": "function", "function": {"name": ...}}, ...]}}``: every tool is still shown to the model
  (OpenAI's point: the prompt, and its cached prefix, stay the same), but only the listed ones may be
  called: "required" constrains the output to calls of those, "auto" parses only calls to those (a
  call to another stays text, as a call to an unknown function does).

A call ends the choice with ``finish_reason: "tool_calls"`` ("stop" for a named function, as OpenAI's
API and vLLM do). Streaming sends content as it is
written and each call as ``delta.tool_calls`` once it is certain (tool_call_parser.py: a half-written
``<tool_call>`` never reaches the client as content).
A template that ignores ``tools`` (SmolLM2's GGUF one) gets them as a system message in the hermes
format instead, and earlier calls in the history as ``<tool_call>`` text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator

from aioinfer.entrypoints.openai.errors import bad_request
from aioinfer.entrypoints.openai.tool_call_parser import ToolCallParser
from aioinfer.structured_output import StructuredOutputsParams
from aioinfer.structured_output.closed_objects import copy_json


class FunctionDefinition(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str
    description: Optional[str] = None
    parameters: Optional[dict[str, Any]] = None
    strict: Optional[bool] = None


class ChatTool(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["function"] = "function"
    function: NamedFunction


class AllowedTools(BaseModel):
    model_config = ConfigDict(extra="ignore")
    mode: Literal["auto", "required"]
    tools: list[NamedToolChoice] = Field(min_length=1)


class AllowedToolsChoice(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["allowed_tools"]
    allowed_tools: AllowedTools


def choice_tag(value) -> str:
    """The union tag of an object ``tool_choice``: its ``type`` (a chat body may leave "function" out)."""
    kind = value.get("type", "function") if isinstance(value, dict) else getattr(value, "type", None)
    return f"type[{kind}]"


# A named function or OpenAI's allowed_tools, told apart by ``type`` (so that an error names the
# branch the body meant, not every branch of the union). The tags are written as union branches are
# ("type[...]"), which errors.py leaves out of the field an error names.
ObjectToolChoice = Annotated[Union[Annotated[NamedToolChoice, Tag("type[function]")],
                                   Annotated[AllowedToolsChoice, Tag("type[allowed_tools]")]],
                             Discriminator(choice_tag)]


class ToolCallFunction(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str
    arguments: Union[str, dict[str, Any]] = "{}"


class ToolCall(BaseModel):
    """An assistant message's earlier call (in the history)."""

    model_config = ConfigDict(extra="ignore")
    id: Optional[str] = None
    type: Literal["function"] = "function"
    function: ToolCallFunction

    def for_template(self) -> dict:
        arguments = self.function.arguments
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except ValueError:
                raise bad_request(f"tool call {self.function.name!r}: arguments are not JSON",
                                  param="messages") from None
        # Templates render arguments with ``tojson``: a dict, not the string the API carries.
        return {"id": self.id, "type": "function", "function": {"name": self.function.name, "arguments": arguments}}


class ToolFields(BaseModel):
    """Mixed into the chat body."""

    tools: Optional[list[ChatTool]] = Field(default=None, min_length=1)  # [] is a 400, as OpenAI's
    tool_choice: Union[Literal["none", "auto", "required"], ObjectToolChoice, None] = None
    parallel_tool_calls: Optional[bool] = None

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _known_choice_type(cls, value):
        # Another type (OpenAI's "custom", ...) would be reported as the union's first branch ("should
        # be 'none', 'auto' or 'required'"), which says nothing of what was wrong.
        if isinstance(value, dict) and value.get("type", "function") not in ("function", "allowed_tools"):
            raise ValueError(f"type {value.get('type')!r} is not supported: send 'none', 'auto', 'required', "
                             "{'type': 'function', ...} or {'type': 'allowed_tools', ...}")
        return value


# A function without ``parameters`` (or with ``{}``) takes none, as OpenAI defines it (and vLLM
# constrains it): its arguments are ``{}``, not any object the model makes up.
_NO_ARGUMENTS = {"type": "object", "properties": {}, "additionalProperties": False}


@dataclass(slots=True)
class ToolPlan:
    mode: str  # "none" | "auto" | "required" | "named"
    tools: list[dict]  # as the chat template takes them
    names: set[str]
    constraint: Optional[StructuredOutputsParams]
    named: Optional[str] = None
    single: bool = False  # parallel_tool_calls: false

    @property
    def parses(self) -> bool:
        return self.mode != "none"

    def parser(self) -> ToolCallParser:
        """A choice's text read as calls while it streams (tool_call_parser.py)."""
        return ToolCallParser(self.mode, self.names, self.named, max_calls=1 if self.single else None)

    def parse(self, text: str) -> tuple[Optional[str], list[dict]]:
        """(content, tool_calls) of a finished choice's text: what its stream adds up to."""
        parser = self.parser()
        parser.feed(text)
        parser.finish()
        return parser.content, parser.calls


def tool_plan(req, enforce_strict: bool = False) -> Optional[ToolPlan]:
    """The request's tool handling, or None without tools; 400s for inconsistent fields.
    ``enforce_strict`` (the server's ``--enforce-strict-tools``): under "auto", hold the calls to
    ``strict`` functions' schemas (``strict_calls``)."""
    choice = req.tool_choice
    if not req.tools:
        if choice not in (None, "none"):
            raise bad_request("tool_choice needs tools", param="tool_choice")
        return None
    tools = [tool.model_dump(exclude_none=True) for tool in req.tools]
    by_name = {tool.function.name: tool.function for tool in req.tools}
    if isinstance(choice, NamedToolChoice):
        name = choice.function.name
        if name not in by_name:
            raise bad_request(f"tool_choice names {name!r}, which is not in tools", param="tool_choice")
        schema = by_name[name].parameters or _NO_ARGUMENTS
        return ToolPlan("named", tools, set(by_name), StructuredOutputsParams(json=schema), named=name)
    if isinstance(choice, AllowedToolsChoice):
        allowed = {named.function.name for named in choice.allowed_tools.tools}
        unknown = sorted(allowed - by_name.keys())
        if unknown:
            raise bad_request(f"tool_choice.allowed_tools names {', '.join(map(repr, unknown))}, not in tools",
                              param="tool_choice.allowed_tools.tools")
        by_name = {name: function for name, function in by_name.items() if name in allowed}
        choice = choice.allowed_tools.mode
    if choice == "required":
        schema = required_calls_schema(by_name, single=req.parallel_tool_calls is False)
        return ToolPlan("required", tools, set(by_name), StructuredOutputsParams(json=schema))
    mode = choice or "auto"
    constraint = strict_calls(by_name) if enforce_strict and mode == "auto" else None
    return ToolPlan(mode, tools, set(by_name), constraint, single=req.parallel_tool_calls is False)


def required_calls_schema(by_name: dict[str, FunctionDefinition], single: bool = False) -> dict:
    """``tool_choice: "required"``: a list of ``{"name", "parameters"}`` objects, each one function's
    name and arguments by its schema (one object when ``single``, ``parallel_tool_calls: false``).

    Each function's schema sits inside the list's schema, at ``#/items/anyOf/<i>/properties/parameters``,
    so its local references (``#/$defs/A``, pydantic's for every nested model; ``#`` for a recursive
    one) are rebased there: left as they are, they would point into the list's schema ("Pointer
    '/$defs/A' does not exist"). vLLM moves every function's ``$defs`` to the root instead, and refuses
    two functions whose definitions share a name but differ; rebased in place, they never meet."""
    options = []
    for i, (name, function) in enumerate(by_name.items()):
        parameters = function.parameters or _NO_ARGUMENTS
        base = f"#/items/anyOf/{i}/properties/parameters"
        options.append({"type": "object", "additionalProperties": False, "required": ["name", "parameters"],
                        "properties": {"name": {"const": name}, "parameters": _rebased(parameters, base)}})
    schema = {"type": "array", "minItems": 1, "items": {"anyOf": options}}
    if single:
        schema["maxItems"] = 1
    return schema


# Keywords whose values are data, not schemas (a "$ref" key inside them is not a reference), and
# keywords whose values map names to schemas.
_DATA_KEYWORDS = ("const", "enum", "default", "examples")
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def _rebased(schema: dict, base: str) -> dict:
    """A copy of ``schema`` whose local references (``#``, ``#/...``) point to the same places once
    the schema sits at ``base`` in a larger one. Its own ``$id`` is dropped: it would make them
    resolve against the schema itself again. Iterative: nesting is bounded later (limits.py), not here."""
    copied = copy_json(schema)
    copied.pop("$id", None)
    stack: list = [copied]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        ref = node.get("$ref")
        if isinstance(ref, str) and (ref == "#" or ref.startswith("#/")):
            node["$ref"] = base + ref[1:]
        for key, value in node.items():
            if key in _SCHEMA_MAPS and isinstance(value, dict):
                stack.extend(value.values())  # named schemas: a property may be called "const"
            elif key not in _DATA_KEYWORDS:
                stack.append(value)
    return copied


# The hermes call as Qwen2.5's chat template teaches it, up to where the arguments begin.
_CALL_BEGIN = '<tool_call>\n{"name": %s, "arguments": '
_CALL_END = "}\n</tool_call>"


def strict_calls(by_name: dict[str, FunctionDefinition]) -> Optional[StructuredOutputsParams]:
    """Under "auto", OpenAI's ``strict: true`` (a call's arguments always match its function's
    schema), which vLLM gives behind VLLM_ENFORCE_STRICT_TOOL_CALLING: a structural tag triggered
    by ``<tool_call>``. The text is free until the model writes that tag; from there it must write a
    call in the hermes form to one of the functions, a strict one's arguments by its schema (another's
    any JSON object), then ``</tool_call>``, and is free again. None when no function is strict.
    Calls written otherwise (bare JSON, which small models write) are parsed as without it."""
    if not any(function.strict for function in by_name.values()):
        return None
    structures = [{"begin": _CALL_BEGIN % json.dumps(name, ensure_ascii=False),
                   "schema": (function.parameters or _NO_ARGUMENTS) if function.strict else {"type": "object"},
                   "end": _CALL_END} for name, function in by_name.items()]
    return StructuredOutputsParams(structural_tag={"structures": structures, "triggers": ["<tool_call>"]})
