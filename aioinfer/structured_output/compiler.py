"""Compiles StructuredOutputsParams into llguidance matchers for one tokenizer, with a cache by grammar.

Each request gets a matcher of its own, built from the grammar's llguidance text (cached by grammar:
a JSON schema is translated and checked once), with its first mask computed here, off the step loop
(llguidance builds its lexer lazily). Not a ``deep_copy`` of one template: copies share the
template's lexer caches, so the executor's threads serialise on them. On the H200's 16 cores, 256
matchers' masks took 2.4 ms a step on 12 threads as copies of one template (more than on one thread,
2.1 ms) and 0.54 ms as matchers of their own; building one costs about 0.4 ms (a schema of
free strings, 1.7 ms on average for the generated test schemas). Construction and masks drop the
GIL, which is why the server builds its requests' matchers ahead in a worker thread (``prepare``,
called by ``Engine.prepare_structured_output``): ``compile`` then takes one of those.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Sequence

from aioinfer.structured_output.llg_tokenizer import llg_tokenizer
from aioinfer.structured_output.params import InvalidGrammarError, StructuredOutputsParams

_CACHE_SIZE = 256  # distinct grammars whose llguidance text is kept
_READY_PER_GRAMMAR = 64  # matchers built ahead and not taken (a request refused after ``prepare``) stay bounded
_KIND_NAMES = {"json": "JSON schema", "json_object": "JSON object", "regex": "regex", "choice": "choice",
               "grammar": "grammar", "structural_tag": "structural tag"}


@dataclass(slots=True)
class _Grammar:
    text: str  # llguidance's grammar
    ready: deque = field(default_factory=lambda: deque(maxlen=_READY_PER_GRAMMAR))  # matchers built ahead


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
        self._cache: OrderedDict[tuple, _Grammar] = OrderedDict()

    def compile(self, params: StructuredOutputsParams):
        """A matcher of its own for one request: one built ahead by ``prepare`` if there is one."""
        key = params.key
        with self._lock:
            grammar = self._cache.get(key)
            if grammar is not None:
                self._cache.move_to_end(key)
                if grammar.ready:
                    return grammar.ready.popleft()
        if grammar is not None:
            return self._matcher(grammar.text, params)
        text = self._grammar(params)
        matcher = self._matcher(text, params)  # checked before the text is cached
        with self._lock:
            self._cache.setdefault(key, _Grammar(text))
            while len(self._cache) > _CACHE_SIZE:
                self._cache.popitem(last=False)
        return matcher

    def prepare(self, params: StructuredOutputsParams, count: int = 1) -> None:
        """Build ``count`` matchers for the next ``compile``s of ``params``, in the caller's thread
        (raises ``InvalidGrammarError`` as ``compile`` does)."""
        matchers = [self.compile(params) for _ in range(count)]
        with self._lock:
            grammar = self._cache.get(params.key)
            if grammar is not None:
                grammar.ready.extend(matchers)

    def llg_tokenizer(self):
        """The llguidance view of the tokenizer: the model's vocabulary size, its EOS ids as EOS."""
        if self._tokenizer is None:
            with self._lock:
                if self._tokenizer is None:
                    self._tokenizer = llg_tokenizer(self._hf_tokenizer, self._vocab_size, self._eos_token_ids)
        return self._tokenizer

    def _grammar(self, params: StructuredOutputsParams) -> str:
        try:
            return grammar_text(params)
        except ValueError as exc:
            raise InvalidGrammarError(f"invalid {_KIND_NAMES[params.kind]}: {exc}") from exc

    def _matcher(self, grammar: str, params: StructuredOutputsParams):
        import llguidance

        matcher = llguidance.LLMatcher(self.llg_tokenizer(), grammar, log_level=0)
        if matcher.is_error():
            raise InvalidGrammarError(f"invalid {_KIND_NAMES[params.kind]}: {matcher.get_error()}")
        # The first mask builds the lexer's start: computed here, that cost stays in the compiling
        # thread, off the step loop.
        matcher.compute_bitmask()
        return matcher


def grammar_text(params: StructuredOutputsParams) -> str:
    """The llguidance grammar for the params (raises ValueError on malformed input)."""
    import llguidance

    kind = params.kind
    if kind in ("json", "json_object"):
        schema = params.json if kind == "json" else {"type": "object"}
        return llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=_json_options(params))
    if kind == "structural_tag":
        # The first trigger each structure's begin starts with (vLLM's rule); triggers are matched as
        # text, not as special tokens (Qwen2.5's <tool_call> is an ordinary added token).
        spec = params.structural_tag
        tags = [llguidance.StructTag(trigger=next(t for t in spec["triggers"] if s["begin"].startswith(t)),
                                     begin=s["begin"], grammar=s["schema"], end=s["end"])
                for s in spec["structures"]]
        return llguidance.StructTag.to_grammar(tags, assume_special=False)
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

