"""Constraints that cost without bound or match nothing, for the grammar-limit tests (the engine's
pieces in structured_output/test_grammar_limits.py, the real server in server/test_server_grammar_limits.py)."""

from __future__ import annotations


def ref_chain(n: int) -> dict:
    defs = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(n)}
    defs[f"d{n}"] = {"type": "string"}
    return {"$ref": "#/$defs/d0", "$defs": defs}


def anyof_chain(n: int) -> dict:
    defs = {f"d{i}": {"anyOf": [{"$ref": f"#/$defs/d{i + 1}"}, {"type": "null"}]} for i in range(n)}
    defs[f"d{n}"] = {"type": "string"}
    return {"$ref": "#/$defs/d0", "$defs": defs}


def items_chain(n: int) -> dict:
    defs = {f"d{i}": {"type": "array", "items": {"$ref": f"#/$defs/d{i + 1}"}} for i in range(n)}
    defs[f"d{n}"] = {"type": "string"}
    return {"$ref": "#/$defs/d0", "$defs": defs}


def rule_chain(n: int, gbnf: bool = False) -> str:
    if gbnf:
        return "\n".join(["root ::= r0", *(f"r{i} ::= r{i + 1}" for i in range(n)), f'r{n} ::= "a"'])
    return "\n".join(["start: r0", *(f"r{i}: r{i + 1}" for i in range(n)), f'r{n}: "a"'])


UNSATISFIABLE = {  # issue 54, item 6
    "$ref #": {"json": {"$ref": "#"}},
    "a -> a": {"json": {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}}},
    "a -> b -> a": {"json": {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}}},
    "anyOf [self]": {"json": {"anyOf": [{"$ref": "#"}]}},
    "GBNF root ::= root a": {"grammar": 'root ::= root "a"'},
    "Lark x: x": {"grammar": "start: x\nx: x"},
}
