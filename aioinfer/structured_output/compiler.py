"""Compiles StructuredOutputsParams into llguidance matchers for one tokenizer, with a cache by grammar.

Each request gets its own matcher (a ``deep_copy`` of the cached one: parsing and checking the
grammar happen once per distinct grammar). llguidance builds its lexer lazily, so the compiler computes the template's first mask
(most of that work, shared by its copies); construction and masks drop the GIL, which is why the
server compiles in a worker thread (``Engine.prepare_structured_output``).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Sequence

from aioinfer.structured_output.llg_tokenizer import llg_tokenizer
from aioinfer.structured_output.params import InvalidGrammarError, StructuredOutputsParams

_CACHE_SIZE = 256  # distinct grammars kept (a matcher is a few KB to a few MB)
_KIND_NAMES = {"json": "JSON schema", "json_object": "JSON object", "regex": "regex", "choice": "choice",
               "grammar": "grammar"}


class GrammarCompiler:
    """``compile(params) -> llguidance.LLMatcher``, ready for the request's first token.

    Thread-safe: the server compiles in worker threads while the engine's thread uses matchers.
    """

    def __init__(self, hf_tokenizer, vocab_size: int, eos_token_ids: Sequence[int]) -> None:
        if hf_tokenizer is None:
            raise InvalidGrammarError("structured outputs need the model's tokenizer, and this model has none")
        self._hf_tokenizer = hf_tokenizer
        self._vocab_size = vocab_size
        self._eos_token_ids = list(eos_token_ids)
        self._tokenizer = None  # llguidance.LLTokenizer, built at first use (about a second)
        self._lock = threading.Lock()
        self._cache: OrderedDict[tuple, object] = OrderedDict()

    def compile(self, params: StructuredOutputsParams):
        key = params.key
        with self._lock:
            template = self._cache.get(key)
            if template is not None:
                self._cache.move_to_end(key)
        if template is None:
            template = self._build(params)
            with self._lock:
                self._cache[key] = template
                while len(self._cache) > _CACHE_SIZE:
                    self._cache.popitem(last=False)
        return template.deep_copy()

    def llg_tokenizer(self):
        """The llguidance view of the tokenizer: the model's vocabulary size, its EOS ids as EOS."""
        if self._tokenizer is None:
            with self._lock:
                if self._tokenizer is None:
                    self._tokenizer = llg_tokenizer(self._hf_tokenizer, self._vocab_size, self._eos_token_ids)
        return self._tokenizer

    def _build(self, params: StructuredOutputsParams):
        import llguidance

        name = _KIND_NAMES[params.kind]
        try:
            grammar = grammar_text(params)
        except ValueError as exc:
            raise InvalidGrammarError(f"invalid {name}: {exc}") from exc
        matcher = llguidance.LLMatcher(self.llg_tokenizer(), grammar, log_level=0)
        if matcher.is_error():
            raise InvalidGrammarError(f"invalid {name}: {matcher.get_error()}")
        # The first mask builds the lexer's start (its copies share what it built): computed here, that
        # cost stays in the compiling thread, off the step loop.
        matcher.compute_bitmask()
        return matcher


def grammar_text(params: StructuredOutputsParams) -> str:
    """The llguidance grammar for the params (raises ValueError on malformed input)."""
    import llguidance

    kind = params.kind
    if kind in ("json", "json_object"):
        schema = params.json if kind == "json" else {"type": "object"}
        return llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=_json_options(params))
    if kind == "choice":
        # A choice is matched literally: each option a quoted Lark string.
        return llguidance.LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in params.choice))
    return llguidance.grammar_from("regex" if kind == "regex" else "grammar", getattr(params, kind))


def _json_options(params: StructuredOutputsParams) -> dict:
    if params.whitespace_pattern is not None:
        return {"whitespace_flexible": True, "whitespace_pattern": params.whitespace_pattern}
    if params.disable_any_whitespace:
        return {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}
    return {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}

