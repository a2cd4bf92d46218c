"""What a request's output must match (vLLM's ``StructuredOutputsParams``), validated on construction."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional, Union

from aioinfer.errors import AioinferError


class InvalidGrammarError(AioinferError, ValueError):
    """The schema, regex, choice list or grammar cannot constrain this model's output (HTTP 400)."""


_KINDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


@dataclass(slots=True)
class StructuredOutputsParams:
    """Exactly one of ``json`` (a JSON schema, dict or string), ``regex``, ``choice`` (the output is one
    of these strings), ``grammar`` (Lark, or llama.cpp's GBNF), ``json_object`` (any JSON object) or
    ``structural_tag`` (vLLM's: ``{"structures": [{"begin": ..., "schema": {...}, "end": ...}],
    "triggers": [...]}``, a dict or its JSON: free text, except that after a trigger the text must
    complete one structure's ``begin``, then JSON matching its schema, then its ``end``).

    JSON is written compactly by default, ``", "`` and ``": "`` between items and keys and no other
    whitespace: small models given free whitespace can emit newlines until ``max_tokens``.
    ``whitespace_pattern`` (a regex) allows other whitespace; ``disable_any_whitespace`` writes
    ``","`` and ``":"`` only.

    ``disable_additional_properties`` (vLLM's name and meaning): an object schema that lists
    ``properties`` and says nothing of ``additionalProperties`` allows no other keys (vLLM's default
    backend, xgrammar, does so; tool schemas from LangChain, MCP servers and pydantic rarely say
    ``additionalProperties: false``, and small models fill such objects with invented keys). None:
    the default, which is True here (a server's ``--no-disable-additional-properties`` changes it for
    its requests); False: such objects take any other keys, as JSON Schema itself says.
    """

    json: Union[str, dict, None] = None
    regex: Optional[str] = None
    choice: Optional[list[str]] = None
    grammar: Optional[str] = None
    json_object: Optional[bool] = None
    structural_tag: Union[str, dict, None] = None
    disable_any_whitespace: bool = False
    whitespace_pattern: Optional[str] = None
    disable_additional_properties: Optional[bool] = None  # None: True (see the class docstring)
    disable_fallback: bool = False  # accepted for vLLM compatibility: there is one backend, no fallback

    def __post_init__(self) -> None:
        given = [kind for kind in _KINDS if getattr(self, kind) not in (None, False)]
        if len(given) != 1:
            raise InvalidGrammarError(
                "structured outputs need exactly one of json, regex, choice, grammar, json_object or "
                "structural_tag, got "
                + (", ".join(given) if given else "none"))
        if isinstance(self.json, str):
            try:
                self.json = json.loads(self.json)
            except ValueError as exc:
                raise InvalidGrammarError(f"the JSON schema is not valid JSON: {exc}") from exc
            except RecursionError:  # nested past Python's parser: far past what the compiler takes (limits.py)
                raise InvalidGrammarError("the JSON schema nests too deeply") from None
        if self.json is not None and not isinstance(self.json, (dict, bool)):
            raise InvalidGrammarError(f"a JSON schema must be an object, got {type(self.json).__name__}")
        if self.regex is not None and not isinstance(self.regex, str):
            raise InvalidGrammarError("regex must be a string")
        if self.grammar is not None and (not isinstance(self.grammar, str) or not self.grammar.strip()):
            raise InvalidGrammarError("grammar must be a non-empty string")
        if self.choice is not None:
            if (not isinstance(self.choice, (list, tuple)) or not self.choice
                    or not all(isinstance(c, str) and c for c in self.choice)):
                raise InvalidGrammarError("choice must be a non-empty list of non-empty strings")
            self.choice = list(self.choice)
        if self.structural_tag is not None:
            self.structural_tag = _structural_tag(self.structural_tag)
        if self.whitespace_pattern is not None and not isinstance(self.whitespace_pattern, str):
            raise InvalidGrammarError("whitespace_pattern must be a string")
        if self.disable_additional_properties is not None and not isinstance(self.disable_additional_properties, bool):
            raise InvalidGrammarError("disable_additional_properties must be a bool")

    @property
    def kind(self) -> str:
        """Which constraint: "json", "regex", "choice", "grammar", "json_object" or "structural_tag"."""
        return next(kind for kind in _KINDS if getattr(self, kind) not in (None, False))

    @property
    def key(self) -> tuple[Any, ...]:
        """Equal for requests that compile to the same grammar (the compiler's cache key)."""
        spec = self.json if self.kind == "json" else getattr(self, self.kind)
        text = json.dumps(spec, sort_keys=True) if isinstance(spec, (dict, list, bool)) else spec
        return (self.kind, text, self.disable_any_whitespace, self.whitespace_pattern, self.closes_objects)

    @property
    def closes_objects(self) -> bool:
        """Whether objects that list ``properties`` allow no other keys (``disable_additional_properties``)."""
        return self.disable_additional_properties is not False


def _structural_tag(spec: Union[str, dict]) -> dict:
    """vLLM's structural tag, checked: ``structures`` (each ``begin``, ``schema``, ``end``) and
    ``triggers``, every structure's ``begin`` starting with one of them."""
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except ValueError as exc:
            raise InvalidGrammarError(f"the structural tag is not valid JSON: {exc}") from exc
        except RecursionError:
            raise InvalidGrammarError("the structural tag nests too deeply") from None
    if not isinstance(spec, dict):
        raise InvalidGrammarError(f"a structural tag must be an object, got {type(spec).__name__}")
    if "format" in spec and "structures" not in spec:
        raise InvalidGrammarError("structural tags in the \"format\" form are not supported yet; "
                                  "use \"structures\" and \"triggers\"")
    structures, triggers = spec.get("structures"), spec.get("triggers")
    if not isinstance(triggers, list) or not triggers or not all(isinstance(t, str) and t for t in triggers):
        raise InvalidGrammarError("a structural tag needs \"triggers\", a non-empty list of non-empty strings")
    if not isinstance(structures, list) or not structures:
        raise InvalidGrammarError("a structural tag needs \"structures\", a non-empty list")
    for i, item in enumerate(structures):
        if (not isinstance(item, dict) or not isinstance(item.get("begin"), str) or not item["begin"]
                or not isinstance(item.get("end", ""), str) or not (isinstance(item.get("schema", {}), dict)
                                                                    or item.get("schema") is True)):
            raise InvalidGrammarError(f"structural tag structure {i}: needs a \"begin\" and an \"end\" string "
                                      "and a \"schema\" object")
        if not any(item["begin"].startswith(t) for t in triggers):
            raise InvalidGrammarError(f"structural tag structure {i}: its begin {item['begin']!r} starts with "
                                      "none of the triggers")
    return {"structures": [{"begin": item["begin"], "schema": {} if item.get("schema", True) is True else item["schema"],
                            "end": item.get("end", "")}
                           for item in structures], "triggers": list(triggers)}
