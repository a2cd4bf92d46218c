"""Structured-output fields of a request body: OpenAI's ``response_format`` and vLLM's extras.

``response_format``: ``{"type": "text"}`` (no constraint), ``{"type": "json_object"}`` or
``{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}, "strict": ...}}``, or vLLM's
``{"type": "structural_tag", "structures": [...], "triggers": [...]}``.
vLLM's ``structured_outputs`` object (``json``, ``regex``, ``choice``, ``grammar``, ``json_object``,
``structural_tag``, ...) and its older ``guided_json`` / ``guided_regex`` / ``guided_choice`` /
``guided_grammar`` / ``structural_tag`` fields. A request may use one of these ways; two are a 400, as is a schema or grammar that does not
compile (named by the field that carried it).

``structured_outputs.disable_additional_properties`` (vLLM's): false lets objects that list their
keys take others too; left out, the server's setting applies (``with_server_defaults``: on unless
``--no-disable-additional-properties``), to tool_choice's constraints as well.
"""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from aioinfer.entrypoints.openai.errors import bad_request
from aioinfer.structured_output import InvalidGrammarError, StructuredOutputsParams


class JsonSchemaFormat(BaseModel):
    # Clients send fields OpenAI added over time (strict, description, ...): the ones used are below.
    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    name: str = "response"
    description: Optional[str] = None
    schema_: Union[dict[str, Any], bool, None] = Field(default=None, alias="schema")
    strict: Optional[bool] = None


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: Optional[JsonSchemaFormat] = None
    structures: Optional[list[Any]] = None  # structural_tag's
    triggers: Optional[list[Any]] = None
    format: Optional[dict[str, Any]] = None  # the newer structural tag form (refused with a reason)


class StructuredFields(BaseModel):
    """Mixed into the completions and chat bodies."""

    response_format: Optional[ResponseFormat] = None
    structured_outputs: Optional[dict[str, Any]] = None
    guided_json: Union[str, dict[str, Any], None] = None
    guided_regex: Optional[str] = None
    guided_choice: Optional[list[str]] = None
    guided_grammar: Optional[str] = None
    guided_whitespace_pattern: Optional[str] = None
    guided_decoding_backend: Optional[str] = None  # accepted: there is one backend (llguidance)
    structural_tag: Union[str, dict[str, Any], None] = None  # vLLM's before structured_outputs held it


def structured_outputs_of(req: StructuredFields) -> Optional[StructuredOutputsParams]:
    """The request's constraint, or None; raises a 400 APIError naming the field."""
    found: list[tuple[str, dict]] = []
    fmt = req.response_format
    if fmt is not None and fmt.type != "text":
        if fmt.type == "json_object":
            found.append(("response_format", {"json_object": True}))
        elif fmt.type == "structural_tag":
            tag = {name: value for name in ("structures", "triggers", "format")
                   if (value := getattr(fmt, name)) is not None}
            found.append(("response_format", {"structural_tag": tag}))
        else:
            if fmt.json_schema is None:
                raise bad_request("response_format json_schema needs its json_schema object", param="response_format")
            schema = fmt.json_schema.schema_
            found.append(("response_format", {"json": schema} if schema is not None else {"json_object": True}))
    if req.structured_outputs is not None:
        found.append(("structured_outputs", dict(req.structured_outputs)))
    guided = {kind: getattr(req, f"guided_{kind}") for kind in ("json", "regex", "choice", "grammar")}
    for kind, value in guided.items():
        if value is not None:
            found.append((f"guided_{kind}", {kind: value}))
    if req.structural_tag is not None:
        found.append(("structural_tag", {"structural_tag": req.structural_tag}))
    if not found:
        return None
    if len(found) > 1:
        raise bad_request("use one of " + ", ".join(name for name, _ in found) + " to constrain the output, not "
                          "several", param=found[1][0])
    name, fields = found[0]
    if req.guided_whitespace_pattern is not None and name != "structured_outputs":
        fields["whitespace_pattern"] = req.guided_whitespace_pattern
    try:
        return StructuredOutputsParams(**fields)
    except TypeError as exc:  # an unknown key in structured_outputs
        raise bad_request(f"structured_outputs: {exc}", param=name) from None
    except InvalidGrammarError as exc:
        raise bad_request(str(exc), param=name) from None


def with_server_defaults(params, disable_additional_properties: bool):
    """``params`` (SamplingParams) with the server's default for what its request left out:
    ``disable_additional_properties`` (ServerConfig's, ``--[no-]disable-additional-properties``)."""
    constraint = params.structured_outputs
    if constraint is not None and constraint.disable_additional_properties is None:
        constraint.disable_additional_properties = disable_additional_properties
    return params
