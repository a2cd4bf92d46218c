"""What a constraint allows, as vLLM's default backend (xgrammar) reads it, checked on the compiled
matcher (SmolLM2's tokenizer): objects that list their keys allow no others unless asked
(structured_output/closed_objects.py), a regex's \\d, \\w and \\s are ASCII, and a "required"
tool_choice keeps each function's $refs pointing into its own schema (tool_calls.py)."""

from __future__ import annotations

import pytest

from aioinfer.entrypoints.openai.tool_calls import FunctionDefinition, required_calls_schema
from aioinfer.structured_output import InvalidGrammarError, StructuredOutputsParams
from aioinfer.structured_output.closed_objects import closed
from aioinfer.structured_output.compiler import GrammarCompiler

VOCAB, EOS = 49152, 2


@pytest.fixture(scope="module")
def compiler(smollm2_tokenizer):
    return GrammarCompiler(smollm2_tokenizer, VOCAB, [EOS])


@pytest.fixture(scope="module")
def accepts(compiler, smollm2_tokenizer):
    """accepts(text, **params): whether the constraint matches ``text`` whole."""
    def check(text: str, **params) -> bool:
        matcher = compiler.compile(StructuredOutputsParams(**params))
        ids = smollm2_tokenizer.encode(text, add_special_tokens=False)
        return matcher.validate_tokens(ids) == len(ids) and matcher.consume_tokens(ids) and matcher.is_accepting()
    return check


WEATHER = {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
           "required": ["city"]}


def test_objects_that_list_their_keys_allow_no_others_unless_asked(accepts):
    assert accepts('{"city": "Paris", "unit": "C"}', json=WEATHER)
    assert not accepts('{"city": "Paris", "zone": "EU"}', json=WEATHER)
    assert accepts('{"city": "Paris", "zone": "EU"}', json=WEATHER, disable_additional_properties=False)
    assert accepts('{"city": "Paris", "zone": "EU"}', json={**WEATHER, "additionalProperties": True})
    nested = {"type": "object", "properties": {"place": {"$ref": "#/$defs/Place"}}, "required": ["place"],
              "$defs": {"Place": {"type": "object", "properties": {"city": {"type": "string"}}}}}
    assert accepts('{"place": {"city": "Oslo"}}', json=nested)
    assert not accepts('{"place": {"city": "Oslo", "zip": "0150"}}', json=nested)
    # An object that lists no keys is any object (json_object mode too), a key that "required" names
    # without a schema stays allowed (else the schema would match nothing).
    assert accepts('{"any": [1]}', json={"type": "object"}) and accepts('{"any": 1}', json_object=True)
    assert accepts('{"a": 1, "b": 2}', json={"type": "object", "properties": {"a": {"type": "integer"}},
                                             "required": ["a", "b"]})
    # Data is not schema: an "enum" of objects is left as written.
    assert accepts('{"v": {"k": 1, "z": 2}}', json={"type": "object", "properties": {
        "v": {"enum": [{"k": 1, "z": 2}]}}})


def test_combined_objects_are_closed_over_the_union_of_their_keys(accepts):
    """Closing each part of an allOf would forbid the others' keys (llguidance intersects them)."""
    both = {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                      {"$ref": "#/$defs/B"}],
            "$defs": {"B": {"type": "object", "properties": {"b": {"type": "integer"}}}}}
    assert accepts('{"a": 1, "b": 2}', json=both)
    assert not accepts('{"a": 1, "c": 2}', json=both)
    assert not accepts('{"a": "x"}', json=both)
    beside = {"type": "object", "properties": {"kind": {"type": "string"}},
              "anyOf": [{"properties": {"x": {"type": "integer"}}, "required": ["x"]},
                        {"properties": {"y": {"type": "integer"}}, "required": ["y"]}]}
    assert accepts('{"kind": "p", "x": 1}', json=beside) and accepts('{"kind": "p", "y": 1}', json=beside)
    assert not accepts('{"kind": "p", "x": 1, "w": 0}', json=beside)
    # A union of objects (pydantic's Union of models): each alternative is closed on its own.
    union = {"anyOf": [{"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]},
                       {"type": "object", "properties": {"y": {"type": "integer"}}, "required": ["y"]}]}
    assert accepts('{"x": 1}', json=union) and not accepts('{"x": 1, "y": 2}', json=union)


def test_closing_copies_and_walks_without_recursion():
    schema = {"type": "object", "properties": {"a": {"type": "object", "properties": {}}}}
    result = closed(schema)
    assert result["additionalProperties"] is False and result["properties"]["a"]["additionalProperties"] is False
    assert "additionalProperties" not in schema  # the request's own schema is left as it came
    deep = leaf = {}
    for _ in range(5000):  # deeper than Python's recursion limit
        leaf["properties"] = {"x": {}}
        leaf = leaf["properties"]["x"]
    assert closed(deep)["additionalProperties"] is False


def test_regex_classes_are_ascii_unless_asked(accepts):
    assert accepts("555-0123", regex=r"\d{3}-\d{4}")
    assert not accepts("٥٥٥-٠١٢٣", regex=r"\d{3}-\d{4}")  # Arabic-Indic digits
    assert not accepts("🯵🯵🯵-🯰🯱🯲🯳", regex=r"\d{3}-\d{4}")  # the issue's: Unicode "segmented" digits
    assert accepts("٥٥٥", regex=r"\p{Nd}{3}")  # asked for by name
    assert accepts("ab_9 x", regex=r"\w+\s\w") and not accepts("é x", regex=r"\w+\s\w")
    assert not accepts("a\u00a0b", regex=r"\w\s\w")  # a no-break space is Unicode whitespace, not ASCII
    assert accepts("1/2", regex=r"\d/\d") and accepts("x", regex=r"[^\d]")
    assert accepts('"123"', json={"type": "string", "pattern": r"^\d+$"})  # JSON Schema's are ASCII already
    assert not accepts('"١٢٣"', json={"type": "string", "pattern": r"^\d+$"})


def test_required_tool_choice_keeps_each_functions_references(accepts):
    """Pydantic puts nested models in $defs; two functions may name theirs alike, and a recursive
    model refers to the root ("#")."""
    person = {"type": "object", "properties": {"name": {"type": "string"}, "address": {"$ref": "#/$defs/Address"}},
              "required": ["name", "address"],
              "$defs": {"Address": {"type": "object", "properties": {"city": {"type": "string"}},
                                    "required": ["city"]}}}
    site = {"type": "object", "properties": {"address": {"$ref": "#/$defs/Address"}}, "required": ["address"],
            "$id": "https://example.com/site.json",
            "$defs": {"Address": {"type": "object", "properties": {"street": {"type": "string"}},
                                  "required": ["street"]}}}
    tree = {"type": "object", "properties": {"label": {"type": "string"},
                                             "children": {"type": "array", "items": {"$ref": "#"}}},
            "required": ["label"]}
    functions = {name: FunctionDefinition(name=name, parameters=schema)
                 for name, schema in [("save_person", person), ("save_site", site), ("save_tree", tree)]}
    schema = required_calls_schema(functions)
    assert person["properties"]["address"] == {"$ref": "#/$defs/Address"}  # the request's schemas are not changed
    calls = ('[{"name": "save_person", "parameters": {"name": "Ann", "address": {"city": "Oslo"}}}, '
             '{"name": "save_site", "parameters": {"address": {"street": "Main St"}}}, '
             '{"name": "save_tree", "parameters": {"label": "a", "children": [{"label": "b", "children": []}]}}]')
    assert accepts(calls, json=schema)
    assert not accepts('[{"name": "save_site", "parameters": {"address": {"city": "Oslo"}}}]', json=schema)
    one = required_calls_schema(functions, single=True)
    assert not accepts(calls, json=one)


def test_params_refuse_a_switch_that_is_not_a_bool():
    with pytest.raises(InvalidGrammarError, match="disable_additional_properties"):
        StructuredOutputsParams(json={}, disable_additional_properties="no")
    key = {value: StructuredOutputsParams(json=WEATHER, disable_additional_properties=value).key
           for value in (None, True, False)}
    assert key[None] == key[True] != key[False]  # None is the default, True; the compiler's cache tells them apart
