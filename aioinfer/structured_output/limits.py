"""What a constraint may cost to compile: checked in Python before llguidance sees it.

Why these bounds, and why here. llguidance compiles a JSON schema's ``$ref`` chain, and a Lark
grammar's chain of rules, by recursion on the calling thread's stack: a chain of ~930 ``$ref``s
(~90 KB of schema) or ~2,700 rules (~50 KB of grammar) overflows an 8 MiB stack, and the whole
server process dies of SIGSEGV with every request in it. The compile threads therefore get a large
stack of their own (compile_threads.py), and what reaches them is bounded first, so that its
recursion stays far below that stack:

- ``GrammarLimits.max_bytes`` (a setting): the constraint as text (a schema as JSON, a grammar, a
  regex, the choices as a JSON list). Every bound on compile work below scales with it.
- ``MAX_SCHEMA_DEPTH``: the longest path through a JSON schema, nesting and ``$ref`` hops together,
  walked as llguidance compiles it (in document order; a definition is compiled once, when a
  reference first reaches it; ``$defs`` nobody references are not compiled). An 8 MiB stack
  overflowed at ~930 hops of a bare ``$ref`` chain (so up to ~9 KB a hop): 512 levels need under
  5 MiB, against the compile threads' 256 MiB.
- ``MAX_SCHEMA_NODES``: subschemas that walk (and llguidance's compile) reaches, each ``$ref``
  target's subtree counted again: a schema pointing into its own nested parts asks for more work
  than its size.
- ``MAX_GRAMMAR_RULES``: rule definitions of a Lark or GBNF grammar (a chain of rules is at most
  this long: ~3 KB of stack a rule). It also bounds llguidance's Python GBNF-to-Lark conversion,
  which holds the GIL and grows with the square of the rule count (8,000 chained rules: 5 s).

Every walk here is iterative: a schema deep enough to matter must not raise RecursionError in
Python either. Nesting inside one Lark rule is llguidance's to refuse ("too deeply nested"), as is
a regex's (the regex parser's nest limit).

What is not bounded here is bounded by llguidance's own limits (``LLParserLimits``: lexer fuel,
grammar size, Earley items a step) and by the compile-time budget (``compile_timeout``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Optional
from urllib.parse import unquote

from aioinfer.structured_output.params import InvalidGrammarError, StructuredOutputsParams

MAX_SCHEMA_DEPTH = 512  # levels along one path of a JSON schema: nesting plus $ref hops
MAX_GRAMMAR_RULES = 2000  # rule definitions in a Lark or GBNF grammar
# Subschemas llguidance would compile: each $ref target's subtree is compiled once more, so a schema
# that points into its own nested parts can ask for far more work than its size (and this walk too).
MAX_SCHEMA_NODES = 200_000

# A rule definition: a name at the start of a line, then ":" (Lark, also ``?name``, ``!name``,
# ``NAME.2``) or "::=" (GBNF). Lines that continue a rule start with "|", which is not a name.
_RULE = re.compile(r"^[ \t]*[?!]?[A-Za-z_][\w.-]*[ \t]*(?:::=|:)", re.MULTILINE)
_LARK_JSON = re.compile(r"%json\s*")  # a JSON schema inside a Lark grammar: ``%json { ... }``
_SETTINGS = {"max_bytes": "structured_outputs_max_bytes (AIOINFER_STRUCTURED_OUTPUTS_MAX_BYTES)",
             "compile_timeout": "structured_outputs_compile_timeout (AIOINFER_STRUCTURED_OUTPUTS_COMPILE_TIMEOUT)"}


class ConstraintLimitError(InvalidGrammarError):
    """The constraint is larger or deeper than the server compiles, or did not compile within the
    budget (HTTP 400; the message names the limit and, for a setting, its name)."""


@dataclass(frozen=True, slots=True)
class GrammarLimits:
    max_bytes: int = 1 << 20  # the constraint as text
    compile_timeout: float = 10.0  # seconds a request waits for its constraint's matchers

    def __post_init__(self) -> None:
        if not (isinstance(self.max_bytes, int) and not isinstance(self.max_bytes, bool) and self.max_bytes > 0):
            raise ValueError(f"structured_outputs_max_bytes must be a positive integer, got {self.max_bytes!r}")
        if not (isinstance(self.compile_timeout, (int, float)) and not isinstance(self.compile_timeout, bool)
                and self.compile_timeout > 0):
            raise ValueError(f"structured_outputs_compile_timeout must be > 0 seconds, got {self.compile_timeout!r}")


def setting_name(limit: str) -> str:
    """How an operator sets ``limit`` ("max_bytes" or "compile_timeout"), for error messages."""
    return _SETTINGS[limit]


def check_structure(params: StructuredOutputsParams) -> None:
    """Raise ``ConstraintLimitError`` when the constraint nests deeper or has more rules than the
    compiler's stack allows (before anything serialises it: ``params.key`` would recurse)."""
    kind = params.kind
    if kind == "json":
        _check_schema(params.json, "the JSON schema")
    elif kind == "structural_tag":
        for i, item in enumerate(params.structural_tag["structures"]):
            _check_schema(item["schema"], f"structural tag structure {i}'s schema")
    elif kind == "grammar":
        _check_grammar(params.grammar)


def check_size(params: StructuredOutputsParams, text: str, limits: GrammarLimits) -> None:
    """``text``: the constraint as the cache keys it (``params.key[1]``)."""
    size = len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
    if size > limits.max_bytes:
        raise ConstraintLimitError(
            f"the {_name(params)} is {size} bytes, more than the limit of {limits.max_bytes} "
            f"(setting {setting_name('max_bytes')})")


def describe_error(error: str) -> str:
    """A matcher's error (llguidance's ``get_error``) for a client: its first line (the parser state
    may follow), and in words when it is the grammar's dead end rather than a limit."""
    line = error.strip().split("\n", 1)[0]
    if line.startswith("NoExtension"):
        return "the grammar allows no continuation of this output (a dead end)"
    return line


def _name(params: StructuredOutputsParams) -> str:
    return {"json": "JSON schema", "json_object": "JSON object", "regex": "regex", "choice": "choice list",
            "grammar": "grammar", "structural_tag": "structural tag"}[params.kind]


def _check_grammar(text: str) -> None:
    rules = len(_RULE.findall(text))
    if rules > MAX_GRAMMAR_RULES:
        raise ConstraintLimitError(f"the grammar defines {rules} rules, more than the limit of {MAX_GRAMMAR_RULES}")
    for match in _LARK_JSON.finditer(text):
        try:
            schema, _ = json.JSONDecoder().raw_decode(text, match.end())
        except (ValueError, RecursionError):
            continue  # not JSON after all (a string that says %json?): llguidance judges it
        _check_schema(schema, "a %json schema in the grammar")


def _check_schema(root: Any, what: str) -> None:
    """The deepest path of ``root`` as llguidance's recursion takes it (module docstring)."""
    if not isinstance(root, (dict, list)):
        return
    entered: set[int] = set()  # ids of $ref targets already compiled (a cycle ends there)
    stack: list[tuple[Any, int]] = [(root, 1)]
    visits = 0
    while stack:
        node, depth = stack.pop()
        visits += 1
        if visits > MAX_SCHEMA_NODES:
            raise ConstraintLimitError(f"{what} has more than {MAX_SCHEMA_NODES} subschemas to compile "
                                       "(each $ref target's subschemas count again)")
        if depth > MAX_SCHEMA_DEPTH:
            raise ConstraintLimitError(f"{what} nests deeper than {MAX_SCHEMA_DEPTH} levels "
                                       "(nesting and $ref hops along one path)")
        if isinstance(node, dict):
            children = [value for key, value in node.items()
                        if isinstance(value, (dict, list)) and key not in ("$defs", "definitions")]
            ref = node.get("$ref")
            if isinstance(ref, str):
                target = _resolve(root, ref)
                if isinstance(target, (dict, list)) and id(target) not in entered:
                    entered.add(id(target))
                    children.insert(0, target)
        else:
            children = [value for value in node if isinstance(value, (dict, list))]
        # Reversed: popped in document order, as the recursion visits them.
        stack.extend((child, depth + 1) for child in reversed(children))


def _resolve(root: Any, ref: str) -> Optional[Any]:
    """A local JSON pointer (``#``, ``#/$defs/a``); None for what is not one (anchors, other documents)."""
    if not ref.startswith("#") or (len(ref) > 1 and ref[1] != "/"):
        return None
    node = root
    for part in ref[2:].split("/") if len(ref) > 1 else ():
        part = unquote(part).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict):
            node = node.get(part)
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node
