"""Compiles StructuredOutputsParams into llguidance matchers for one tokenizer, with a cache by grammar.

Each request gets a matcher of its own, built from the grammar's llguidance text (cached by grammar:
a JSON schema is translated and checked once), with its first mask computed here, off the step loop
(llguidance builds its lexer lazily). Not a ``deep_copy`` of one template: copies share the
template's lexer caches, so the executor's threads serialise on them. On the H200's 16 cores, 256
matchers' masks took 2.4 ms a step on 12 threads as copies of one template (more than on one thread,
2.1 ms) and 0.54 ms as matchers of their own; building one costs about 0.4 ms (a schema of
free strings, 1.7 ms on average for the generated test schemas). Construction and masks drop the
GIL, which is why the server builds its requests' matchers ahead in a worker thread (``prepare``,
called by ``Engine.prepare_structured_output``): ``compile`` then takes one of those. A grammar
that takes long to build (over ``_COPY_AFTER``) is the exception: a request's other choices get
copies, since building each would multiply a cost that dwarfs the masks' contention.

Every build runs on the compile threads (compile_threads.py: a large stack, a low priority, at most
a few at once), after the bounds of limits.py, and its caller waits at most the compile-time budget.
A grammar that fails, or overruns the budget, is remembered as such (an error in its cache entry):
the same constraint sent again gets its 400 at once instead of costing another compile.

A constraint that matches no output at all (``{"$ref": "#"}``, GBNF ``root ::= root "a"``) compiles
in llguidance, but its first mask already puts the matcher in its error state ("no extension"):
that is a 400 here, as a syntax error is. A dead end further on (``start: "a" x`` with ``x``
unproductive), or one of llguidance's per-step limits met during generation, is seen by the engine
instead, which then ends the request with ``finish_reason: "error"`` (engine_core.py).
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Optional, Sequence

from aioinfer.errors import EngineOverloaded
from aioinfer.structured_output.closed_objects import closed
from aioinfer.structured_output.compile_threads import CompileBusy, CompileThreads, CompileTimeout, default_compile_threads
from aioinfer.structured_output.limits import (ConstraintLimitError, GrammarLimits, check_size, check_structure,
                                               setting_name)
from aioinfer.structured_output.llg_tokenizer import llg_tokenizer
from aioinfer.structured_output.params import InvalidGrammarError, StructuredOutputsParams

_CACHE_SIZE = 256  # distinct grammars whose llguidance text (or error) is kept
_READY_PER_GRAMMAR = 64  # matchers built ahead and not taken (a request refused after ``prepare``) stay bounded
_COPY_AFTER = 0.05  # seconds: a matcher slower to build than this is copied for a request's other choices
_KIND_NAMES = {"json": "JSON schema", "json_object": "JSON object", "regex": "regex", "choice": "choice",
               "grammar": "grammar", "structural_tag": "structural tag"}


@dataclass(slots=True)
class _Grammar:
    text: Optional[str]  # llguidance's grammar; None when it failed
    ready: deque = field(default_factory=lambda: deque(maxlen=_READY_PER_GRAMMAR))  # matchers built ahead
    error: Optional[str] = None  # why it cannot be compiled (then every request for it gets a 400 at once)
    error_type: type = InvalidGrammarError  # what was raised for it (ConstraintLimitError: a limit)


class GrammarCompiler:
    """``compile(params) -> llguidance.LLMatcher``, ready for the request's first token.

    Thread-safe: the server compiles in worker threads while the engine's thread uses matchers.
    """

    def __init__(self, hf_tokenizer, vocab_size: int, eos_token_ids: Sequence[int],
                 limits: Optional[GrammarLimits] = None, threads: Optional[int] = None) -> None:
        if hf_tokenizer is None:
            raise InvalidGrammarError("structured outputs need the model's tokenizer, and this model has none")
        self._hf_tokenizer = hf_tokenizer
        self._vocab_size = vocab_size
        self._eos_token_ids = list(eos_token_ids)
        self.limits = limits or GrammarLimits()
        self._threads = CompileThreads(threads or default_compile_threads())
        self._tokenizer = None  # llguidance.LLTokenizer, built at first use (about a second)
        self._lock = threading.Lock()
        self._cache: OrderedDict[tuple, _Grammar] = OrderedDict()

    def compile(self, params: StructuredOutputsParams):
        """A matcher of its own for one request: one built ahead by ``prepare`` if there is one."""
        key = _key(params)
        with self._lock:
            grammar = self._cache.get(key)
            if grammar is not None:
                self._cache.move_to_end(key)
                if grammar.error is not None:
                    raise grammar.error_type(grammar.error)
                if grammar.ready:
                    return grammar.ready.popleft()
        return self._build_within_budget(params, key, 1)[0]

    def prepare(self, params: StructuredOutputsParams, count: int = 1) -> None:
        """Build ``count`` matchers for the next ``compile``s of ``params`` (on the compile threads; the
        caller blocks at most the compile-time budget; raises ``InvalidGrammarError`` as ``compile``
        does, ``EngineOverloaded`` when no compile thread was free within the budget)."""
        self.llg_tokenizer()  # built once (about a second), outside any request's budget
        key = _key(params)
        matchers = self._build_within_budget(params, key, count)
        with self._lock:
            grammar = self._cache.get(key)
            if grammar is not None and grammar.error is None:
                grammar.ready.extend(matchers)

    def llg_tokenizer(self):
        """The llguidance view of the tokenizer: the model's vocabulary size, its EOS ids as EOS."""
        if self._tokenizer is None:
            with self._lock:
                if self._tokenizer is None:
                    self._tokenizer = llg_tokenizer(self._hf_tokenizer, self._vocab_size, self._eos_token_ids)
        return self._tokenizer

    def _build_within_budget(self, params: StructuredOutputsParams, key: tuple, count: int) -> list:
        timeout = self.limits.compile_timeout
        try:
            return self._threads.run(self._build, params, key, count, timeout=timeout)
        except CompileTimeout:
            message = (f"the {_KIND_NAMES[params.kind]} did not compile within {timeout:g} s "
                       f"(setting {setting_name('compile_timeout')})")
            self._remember(key, _Grammar(None, error=message, error_type=ConstraintLimitError), replace=True)
            raise ConstraintLimitError(message) from None
        except CompileBusy:
            raise EngineOverloaded(f"every structured-output compile thread stayed busy for {timeout:g} s "
                                   f"(setting {setting_name('compile_timeout')}); retry later",
                                   retry_after=timeout) from None

    def _build(self, params: StructuredOutputsParams, key: tuple, count: int) -> list:
        """``count`` matchers, on a compile thread: the grammar's text first if it is not cached."""
        with self._lock:
            grammar = self._cache.get(key)
        if grammar is not None and grammar.error is not None:
            raise grammar.error_type(grammar.error)
        started = time.perf_counter()
        if grammar is None:
            try:
                check_structure(params)
                check_size(params, key[1], self.limits)
                text = self._grammar(params)
                matchers = [self._matcher(text, params)]  # checked before the text is cached
            except InvalidGrammarError as exc:
                self._remember(key, _Grammar(None, error=str(exc), error_type=type(exc)))
                raise
            self._remember(key, _Grammar(text))
        else:
            text, matchers = grammar.text, []
        if count and not matchers:
            matchers.append(self._matcher(text, params))
        slow = time.perf_counter() - started > _COPY_AFTER
        while len(matchers) < count:
            matchers.append(matchers[0].deep_copy() if slow else self._matcher(text, params))
        return matchers

    def _remember(self, key: tuple, grammar: _Grammar, replace: bool = False) -> None:
        with self._lock:
            if replace:
                self._cache[key] = grammar
            else:
                self._cache.setdefault(key, grammar)
            self._cache.move_to_end(key)
            while len(self._cache) > _CACHE_SIZE:
                self._cache.popitem(last=False)

    def _grammar(self, params: StructuredOutputsParams) -> str:
        try:
            return grammar_text(params)
        except (ValueError, RecursionError) as exc:
            raise InvalidGrammarError(f"invalid {_KIND_NAMES[params.kind]}: {exc}") from exc

    def _matcher(self, grammar: str, params: StructuredOutputsParams):
        import llguidance

        matcher = llguidance.LLMatcher(self.llg_tokenizer(), grammar, log_level=0, limits=_parser_limits())
        if matcher.is_error():
            raise InvalidGrammarError(f"invalid {_KIND_NAMES[params.kind]}: {first_line(matcher.get_error())}")
        # The first mask builds the lexer's start: computed here, that cost stays in the compiling
        # thread, off the step loop. It also finds a constraint that allows nothing at all.
        matcher.compute_bitmask()
        if matcher.is_error():
            error = first_line(matcher.get_error())
            if error.startswith("NoExtension"):
                raise InvalidGrammarError(f"invalid {_KIND_NAMES[params.kind]}: it matches no output at all "
                                          "(every path through it recurses forever or reaches a rule that "
                                          "matches nothing)")
            raise ConstraintLimitError(f"the {_KIND_NAMES[params.kind]} cannot be compiled within "
                                       f"llguidance's limits: {error}")
        return matcher


def first_line(error: str) -> str:
    """llguidance's error without the parser state or backtrace it may append (the first line says
    what failed; a panic's backtrace is empty in a release build)."""
    lines = [line.strip() for line in error.strip().splitlines() if line.strip()]
    line = lines[0] if lines else ""
    if line.endswith(":"):  # a regex's parse error: the pattern and a caret, then "error: <the cause>"
        cause = next((later for later in lines[1:] if later.startswith("error:")), None)
        if cause is not None:
            line = f"{line} {cause.removeprefix('error:').strip()}"
    return f"llguidance failed on it ({line})" if line.startswith("panic:") else line


_limits = None


def _parser_limits():
    """llguidance's own limits (its defaults), with short errors: they reach the client."""
    global _limits
    if _limits is None:
        import llguidance

        _limits = llguidance.LLParserLimits(verbose_errors=False)
    return _limits


def _key(params: StructuredOutputsParams) -> tuple:
    try:
        return params.key
    except RecursionError:  # nested deeper than Python's own serialiser goes, which is deeper than ours
        check_structure(params)
        raise


def grammar_text(params: StructuredOutputsParams) -> str:
    """The llguidance grammar for the params (raises ValueError on malformed input)."""
    import llguidance

    kind = params.kind
    if kind in ("json", "json_object"):
        schema = _schema(params, params.json) if kind == "json" else {"type": "object"}
        return llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=_json_options(params))
    if kind == "structural_tag":
        # The first trigger each structure's begin starts with (vLLM's rule); triggers are matched as
        # text, not as special tokens (Qwen2.5's <tool_call> is an ordinary added token).
        spec = params.structural_tag
        tags = [llguidance.StructTag(trigger=next(t for t in spec["triggers"] if s["begin"].startswith(t)),
                                     begin=s["begin"], grammar=_schema(params, s["schema"]), end=s["end"])
                for s in spec["structures"]]
        return llguidance.StructTag.to_grammar(tags, assume_special=False)
    if kind == "choice":
        # A choice is matched literally: each option a quoted Lark string, all of them one terminal.
        # As alternatives of a rule instead, each was an Earley item: 10,000 of them exceeded
        # llguidance's 2,000 items a row at the first token (the matcher's error state, mid-output),
        # and 100,000 took 10 s to build; as one lexeme they are a trie (1 s for 100,000).
        return llguidance.LLMatcher.grammar_from_lark(
            "start: CHOICE\nCHOICE: " + " | ".join(json.dumps(c) for c in params.choice))
    if kind == "regex":
        # \d, \w and \s as ASCII classes ([0-9], [0-9a-zA-Z_], [ \t\n\r\f\v]), as vLLM's default
        # backend (xgrammar) reads them and as JSON Schema's ``pattern`` is read here: llguidance's own
        # regex (Rust's) takes \d for any Unicode decimal digit, and SmolLM2 held to \d{3}-\d{4} wrote
        # segmented digits (U+1FBF8). A pattern that wants Unicode classes says so: \p{Nd}, \p{L}.
        regex = llguidance.regex_to_lark(params.regex, "dws")  # also escapes "/" for Lark's /.../
        return llguidance.LLMatcher.grammar_from_lark(f"start: /{regex}/")
    return llguidance.grammar_from("grammar", params.grammar)


def _schema(params: StructuredOutputsParams, schema):
    """The schema as compiled: its objects closed unless the params allow other keys (closed_objects.py)."""
    return closed(schema) if params.closes_objects else schema


def _json_options(params: StructuredOutputsParams) -> dict:
    if params.whitespace_pattern is not None:
        return {"whitespace_flexible": True, "whitespace_pattern": params.whitespace_pattern}
    if params.disable_any_whitespace:
        return {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}
    return {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
