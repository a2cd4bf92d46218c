"""Generated JSON schemas for the structured-output tests: nested objects, arrays, enums, required
fields, bounded numbers and patterned strings, drawn from a seeded generator (the same 50 every run)."""

from __future__ import annotations

import random

_NAMES = ["name", "id", "city", "score", "tags", "items", "owner", "size", "color", "status", "count",
          "price", "label", "kind", "level", "code"]
_PATTERNS = [r"^[a-z]{2,6}$", r"^[A-Z][a-z]{1,7}$", r"^\d{3}-\d{2}$", r"^(red|green|blue)$", r"^[A-Z]{2}\d{1,3}$"]
_ENUMS = [["alpha", "beta", "gamma"], ["small", "medium", "large"], [1, 2, 3, 5], ["on", "off", None]]


def schema(rng: random.Random, depth: int = 0) -> dict:
    kinds = ["pattern", "enum", "integer", "number", "boolean", "short_string"]
    if depth < 2:
        kinds += ["object", "array", "object"]
    kind = rng.choice(kinds)
    if kind == "object":
        names = rng.sample(_NAMES, rng.randint(1, 4))
        props = {n: schema(rng, depth + 1) for n in names}
        required = sorted(rng.sample(names, rng.randint(1, len(names))))
        return {"type": "object", "properties": props, "required": required, "additionalProperties": False}
    if kind == "array":
        low = rng.randint(0, 1)
        return {"type": "array", "items": schema(rng, 2), "minItems": low, "maxItems": low + rng.randint(1, 3)}
    if kind == "pattern":
        return {"type": "string", "pattern": rng.choice(_PATTERNS)}
    if kind == "enum":
        return {"enum": rng.choice(_ENUMS)}
    if kind == "integer":
        low = rng.randint(-50, 50)
        return {"type": "integer", "minimum": low, "maximum": low + rng.randint(1, 500)}
    if kind == "number":
        # A number's fraction is otherwise unbounded, and a greedy small model may write digits until
        # max_tokens (seen: SmolLM2 "1.000000012345678901..."): a model habit, not a grammar fault.
        low = rng.randint(-10, 10)
        return {"type": "number", "minimum": low, "maximum": low + rng.randint(1, 100),
                "multipleOf": rng.choice([0.01, 0.25, 0.5])}
    if kind == "short_string":
        return {"type": "string", "minLength": 1, "maxLength": rng.randint(3, 16)}
    return {"type": "boolean"}


def schemas(count: int = 50, seed: int = 17) -> list[dict]:
    """Top-level objects (what response_format json_schema asks for)."""
    rng = random.Random(seed)
    out = []
    while len(out) < count:
        s = schema(rng)
        if s.get("type") == "object":
            out.append(s)
    return out
