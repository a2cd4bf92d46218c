"""JSON schemas whose objects allow only the keys they list (``disable_additional_properties``).

JSON Schema lets an object carry any key its ``properties`` do not name unless the schema says
``additionalProperties: false``; few schemas say it (LangChain's ``@tool``, MCP servers, hand-written
tool schemas), and a small model constrained by such a schema writes invented keys, often until
``max_tokens``. vLLM's default backend (xgrammar, ``strict_mode``) does not allow them, and its
llguidance backend adds ``additionalProperties: false`` under ``disable_additional_properties``;
aioinfer does the latter by default (params.py).

``closed(schema)`` is a copy in which every object schema that lists ``properties`` (or
``patternProperties``) and says nothing of ``additionalProperties`` or ``unevaluatedProperties``
gets ``additionalProperties: false``; a key that ``required`` names without a schema in
``properties`` stays allowed (a sloppy schema would otherwise match nothing at all). Only schema
positions are walked (``properties``, ``items``, ``anyOf``, ``$defs``, ...), never data (``const``,
``enum``, ``default``, ``examples``).

Combined objects are the exception, because closing each part would forbid the other parts' keys
(llguidance intersects ``allOf``: ``{"allOf": [{"properties": {"a": ..}}, {"properties": {"b": ..}}]}``
with both parts closed matches no object at all). A part, inline or through a local ``$ref``, of an
``allOf`` with more than one member, or of any ``allOf`` / ``anyOf`` / ``oneOf`` beside ``properties``
of its own, stays open; the combining schema is closed instead, over the union of the keys its parts
and itself list, when each part is a plain one (it names its keys, combines nothing further and
says nothing of additional keys). Otherwise the combination stays open, as JSON Schema has it.

The walk is iterative: the schema's depth was bounded by limits.py, but Python's recursion limit
is lower than that bound.
"""

from __future__ import annotations

from typing import Any, Iterator, Optional

# Local JSON pointers followed as limits.py follows them.
from aioinfer.structured_output.limits import _resolve as resolve_pointer

# Keywords whose value is a map of names to schemas, and keywords whose value is a schema or a list of them.
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas", "dependencies")
_SUBSCHEMAS = ("additionalProperties", "unevaluatedProperties", "propertyNames", "contains", "additionalItems",
               "unevaluatedItems", "not", "if", "then", "else", "items", "prefixItems", "allOf", "anyOf", "oneOf")
_COMBINERS = ("allOf", "anyOf", "oneOf")
_OPENNESS = ("additionalProperties", "unevaluatedProperties", "patternProperties")


def closed(schema: Any) -> Any:
    """A copy of ``schema`` whose objects allow no keys they do not list (the module docstring)."""
    if not isinstance(schema, dict):
        return schema
    root = copy_json(schema)
    nodes = list(_schemas(root))
    parts: set[int] = set()  # ids of the parts of combinations: they stay open
    combined = []  # (combining schema, its parts) to close over the union of their keys
    for node in nodes:
        members = _combined_parts(root, node)
        if members is not None:
            parts.update(id(part) for part in members if part is not None)
            combined.append((node, members))
    for node in nodes:
        if (id(node) not in parts and _lists_keys(node) and not any(key in node for key in _OPENNESS[:2])
                and not any(key in node for key in _COMBINERS)):  # a combining one: the next loop
            _close_over(node, _required_names(node))
    for node, members in combined:
        if id(node) not in parts and not any(key in node for key in _OPENNESS):
            _close_over_union(node, members)
    return root


def copy_json(value: Any) -> Any:
    """A deep copy of JSON data (dicts, lists, scalars). Iterative: ``copy.deepcopy`` takes two
    frames a level, and a schema within limits.py's depth still goes past Python's recursion limit."""
    if not isinstance(value, (dict, list)):
        return value
    root: Any = {} if isinstance(value, dict) else []
    stack = [(value, root)]
    while stack:
        source, target = stack.pop()
        for key, item in (source.items() if isinstance(source, dict) else enumerate(source)):
            if isinstance(item, (dict, list)):
                new: Any = {} if isinstance(item, dict) else []
                stack.append((item, new))
            else:
                new = item
            if isinstance(target, dict):
                target[key] = new
            else:
                target.append(new)
    return root


def _schemas(root: dict) -> Iterator[dict]:
    """Every schema (a dict) in schema position under ``root``, ``root`` first."""
    stack = [root]
    while stack:
        node = stack.pop()
        yield node
        for key in _SCHEMA_MAPS:
            value = node.get(key)
            if isinstance(value, dict):
                stack.extend(child for child in value.values() if isinstance(child, dict))
        for key in _SUBSCHEMAS:
            value = node.get(key)
            if isinstance(value, dict):
                stack.append(value)
            elif isinstance(value, list):
                stack.extend(child for child in value if isinstance(child, dict))


def _lists_keys(node: dict) -> bool:
    return isinstance(node.get("properties"), dict) or isinstance(node.get("patternProperties"), dict)


def _combined_parts(root: dict, node: dict) -> Optional[list[Optional[dict]]]:
    """The parts of ``node`` if it combines objects (module docstring), a ``$ref`` part resolved
    (None where it does not resolve locally); None if it combines nothing that way."""
    own_keys = _lists_keys(node)
    members: list = []
    for key in _COMBINERS:
        value = node.get(key)
        if isinstance(value, list) and (own_keys or (key == "allOf" and len(value) > 1)):
            members += value
    if not members:
        return None
    parts = []
    for member in members:
        if isinstance(member, dict) and isinstance(member.get("$ref"), str) and len(member) == 1:
            target = resolve_pointer(root, member["$ref"])
            parts.append(target if isinstance(target, dict) else None)
        else:
            parts.append(member if isinstance(member, dict) else None)
    return parts


def _close_over_union(node: dict, parts: list[Optional[dict]]) -> None:
    """``node`` allows only the keys it and its parts list, when every part is plain."""
    names: list[str] = _required_names(node)
    for part in parts:
        if part is None or any(key in part for key in _OPENNESS + _COMBINERS) or "$ref" in part:
            return  # what the part allows is not known from its keys alone: the combination stays open
        names += [name for name in [*(part.get("properties") or {}), *_required_names(part)] if name not in names]
    _close_over(node, names)


def _required_names(node: dict) -> list[str]:
    required = node.get("required")
    return [name for name in required if isinstance(name, str)] if isinstance(required, list) else []


def _close_over(node: dict, names: list[str]) -> None:
    """``node`` allows its ``properties`` and ``names`` (keys other schemas list, or that ``required``
    names without a schema: a sloppy schema stays satisfiable), nothing else."""
    properties = node.setdefault("properties", {})
    if not isinstance(properties, dict):
        return
    for name in names:
        properties.setdefault(name, True)  # a part's own schema, if any, constrains the value
    node["additionalProperties"] = False
