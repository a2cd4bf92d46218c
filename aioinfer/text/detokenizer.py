"""Incremental detokenization: token ids in, newly decodable text out.

Contract (tested in tests/engine/test_detokenizer.py): for one request, the concatenation of
every ``push()`` result and the final ``flush()`` equals
``tokenizer.decode(output_ids, skip_special_tokens=...)`` of the whole output, however
the ids were batched. A character whose UTF-8 bytes span several byte-level or
byte-fallback tokens is held back until it is complete, so no piece ends in a broken
character ('\\ufffd') that a later token would have repaired.

One exception, inherent to SentencePiece's ByteFallback decoder: it decodes a run of
``<0xNN>`` tokens as one group and turns the *whole* run into '\\ufffd's once any byte
in it is invalid, so an already valid character can turn into '\\ufffd' after the fact.
Only an invalid byte sequence (which a tokenizer never produces, a sampler rarely)
triggers it; the stream then keeps the characters it already sent.

Byte-level BPE tokenizers (Qwen2.5, Llama 3, SmolLM2: a bare ``ByteLevel`` decoder) map
every id to a fixed byte string, so their text is the UTF-8 decoding of the ids' bytes
joined: a table of those bytes and of the texts of the ids that are whole characters (built
once per tokenizer, ``byte_level_table``) does per token what the Rust stream does, for one
lookup, or one C-level ``codecs.utf_8_decode`` while a character is split over tokens
(``DecodeStream.step`` was a sixth of the host's time per token: 3.2 against 0.66 us).
Other fast tokenizers use ``tokenizers.decoders.DecodeStream``, which does this in Rust
over a short sliding window of ids. Slow tokenizers use the same windowed algorithm
written over ``tokenizer.decode`` (vLLM's classic prefix_offset/read_offset scheme).

Why the prompt does not prime the stream: for byte-level BPE (Qwen2.5, Llama 3,
SmolLM2) priming changes nothing, while for SentencePiece/Metaspace tokenizers it turns
the first token's "▁Hello" into " Hello", which ``decode(output_ids)`` renders "Hello";
the streamed and the non-streamed text would then disagree. The text of an output is
therefore defined as ``decode(output_ids)``, as in ``transformers``.
"""

from __future__ import annotations

import codecs
import logging
import threading
import weakref
from collections.abc import Sequence
from typing import Any, Optional, Protocol

from tokenizers import Tokenizer, decoders
from tokenizers.decoders import DecodeStream

from aioinfer.text.byte_level import byte_level_alphabet

logger = logging.getLogger(__name__)

_REPLACEMENT = "\ufffd"  # what lossy UTF-8 decoding yields for an incomplete character
_CONTEXT = 6  # ids of left context when decoding a tail on its own (Metaspace spacing)


class _Stepper(Protocol):
    def step(self, token_id: int) -> str | None:
        """Feed the id just appended to the output; return the text it completes, or None."""


class _ByteLevelStream:
    """A byte-level tokenizer's output: each id's bytes (``ByteLevelTable``) through UTF-8
    decoding that holds an unfinished character back and replaces invalid bytes as ``decode``
    does (both substitute maximal invalid subparts; tested against it). The common case, no byte
    held and a token that is whole characters, is one lookup of the token's text."""

    __slots__ = ("_texts", "_bytes", "_held")

    def __init__(self, table: "ByteLevelTable") -> None:
        self._texts = table.texts
        self._bytes = table.raw
        self._held = b""  # the start of a character that is not complete yet

    def step(self, token_id: int) -> str | None:
        try:
            if not self._held:
                text = self._texts[token_id]
                if text is not None:
                    return text
            raw = self._bytes[token_id]
        except IndexError:  # an id past the vocabulary (a model's padded rows): decode skips it
            return None if self._held else ""
        data = self._held + raw
        text, consumed = codecs.utf_8_decode(data, "replace", False)
        self._held = data[consumed:]
        # No text out of some bytes: they start a character that is not complete yet.
        return None if not text and data else text

    def flush(self) -> str:
        """What the held bytes decode to at the end (replacement characters, as decode gives)."""
        held, self._held = self._held, b""
        return codecs.utf_8_decode(held, "replace", True)[0] if held else ""


class _RustStream:
    """``DecodeStream`` over a fast tokenizer, rebuilt when it loses its prefix."""

    __slots__ = ("_backend", "_skip", "_ids", "_stream")

    def __init__(self, backend: Tokenizer, skip_special_tokens: bool, ids: list[int]) -> None:
        self._backend = backend
        self._skip = skip_special_tokens
        self._ids = ids  # the detokenizer's output ids (shared, read-only here)
        self._stream = DecodeStream(skip_special_tokens=skip_special_tokens)

    def step(self, token_id: int) -> str | None:
        try:
            return self._stream.step(self._backend, token_id)
        except Exception as e:  # tokenizers raises a bare Exception
            # A ByteFallback group that turns invalid rewrites text the stream already
            # returned (the module docstring; vllm-project/vllm#17448).
            if "prefix" not in str(e).lower():
                raise
            logger.debug("DecodeStream lost its prefix, rebuilding: %s", e)
            return self._rebuild_and_step(token_id)

    def _rebuild_and_step(self, token_id: int) -> str | None:
        # Prime a fresh stream with a few earlier ids that decode cleanly (discarding
        # their text) so the next token is not treated as the first of the text, which
        # Metaspace decoders would strip of its leading space.
        before = self._ids[:-1]
        for n in range(min(_CONTEXT, len(before)), 0, -1):
            suffix = before[-n:]
            if _REPLACEMENT not in self._backend.decode(suffix, skip_special_tokens=self._skip):
                break
        else:
            suffix = []
        for attempt in (suffix, []):
            self._stream = DecodeStream(skip_special_tokens=self._skip)
            try:
                for tid in attempt:
                    self._stream.step(self._backend, tid)
                return self._stream.step(self._backend, token_id)
            except Exception:
                if not attempt:
                    raise
        raise AssertionError("unreachable")


class _WindowDecoder:
    """vLLM's classic incremental decode over ``tokenizer.decode``, for slow tokenizers."""

    __slots__ = ("_tokenizer", "_kwargs", "_ids", "_prefix_offset", "_read_offset")

    def __init__(self, tokenizer: Any, skip_special_tokens: bool,
                 spaces_between_special_tokens: bool, ids: list[int]) -> None:
        self._tokenizer = tokenizer
        self._kwargs = dict(
            skip_special_tokens=skip_special_tokens,
            spaces_between_special_tokens=spaces_between_special_tokens,
            clean_up_tokenization_spaces=False,
        )
        self._ids = ids  # the detokenizer's output ids (shared, read-only here)
        self._prefix_offset = 0  # ids[prefix_offset:read_offset] give context for spacing
        self._read_offset = 0  # text of ids before this has been returned

    def step(self, token_id: int) -> str | None:
        window = self._ids[self._prefix_offset:]
        prefix = self._tokenizer.decode(window[: self._read_offset - self._prefix_offset], **self._kwargs)
        text = self._tokenizer.decode(window, **self._kwargs)
        if len(text) <= len(prefix) or text.endswith(_REPLACEMENT):
            return None
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        return text[len(prefix):]


class ByteLevelTable:
    """Per id: its bytes (``raw``) and, when those are whole UTF-8 characters, its text (``texts``)."""

    __slots__ = ("raw", "texts")

    def __init__(self, raw: tuple[bytes, ...]) -> None:
        self.raw = raw
        self.texts = tuple(_whole_characters(b) for b in raw)


def _whole_characters(raw: bytes) -> Optional[str]:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


# (id(backend), skip_special_tokens) -> (weak reference to the backend, its table): a table lives
# as long as its tokenizer (a process that loads many models must not keep every table).
_tables: dict[tuple[int, bool], tuple[weakref.ref, ByteLevelTable]] = {}
_tables_lock = threading.RLock()  # reentrant: a weakref callback may run while a table is being built


def byte_level_table(backend: Tokenizer, skip_special_tokens: bool) -> Optional[ByteLevelTable]:
    """Every id's bytes as ``backend.decode`` renders it, when its decoder is a bare ``ByteLevel``
    (None otherwise): a special token is empty when skipped; a token is its characters mapped back
    through the byte-level alphabet, or, when one of them is outside it (an added token with a
    space, say), its own UTF-8 bytes, as the Rust decoder does. Built once per tokenizer (0.1-0.3 s
    for Qwen2.5's 152k ids): ``OutputProcessor`` builds it at start-up, before any request."""
    if not isinstance(backend.decoder, decoders.ByteLevel):
        return None
    key = (id(backend), skip_special_tokens)
    entry = _tables.get(key)
    if entry is not None and entry[0]() is backend:
        return entry[1]
    with _tables_lock:
        entry = _tables.get(key)
        if entry is not None and entry[0]() is backend:
            return entry[1]
        to_byte = {c: b for b, c in byte_level_alphabet().items()}
        special = {i for i, t in backend.get_added_tokens_decoder().items() if t.special}
        rows = []
        for token_id in range(backend.get_vocab_size(with_added_tokens=True)):
            token = backend.id_to_token(token_id)
            if token is None or (skip_special_tokens and token_id in special):
                rows.append(b"")
                continue
            try:
                rows.append(bytes(to_byte[c] for c in token))
            except KeyError:
                rows.append(token.encode("utf-8"))
        table = ByteLevelTable(tuple(rows))

        def forget(_ref, key=key) -> None:
            with _tables_lock:
                if _tables.get(key, (None,))[0] is _ref:
                    del _tables[key]

        _tables[key] = (weakref.ref(backend, forget), table)
        return table


def fast_backend(tokenizer: Any) -> Tokenizer | None:
    """The ``tokenizers.Tokenizer`` behind a transformers tokenizer, or None (slow one)."""
    if isinstance(tokenizer, Tokenizer):
        return tokenizer
    backend = getattr(tokenizer, "backend_tokenizer", None) or getattr(tokenizer, "_tokenizer", None)
    return backend if isinstance(backend, Tokenizer) else None


class IncrementalDetokenizer:
    """Turns one request's output token ids into text, piece by piece.

    ``tokenizer`` is a transformers tokenizer or a bare ``tokenizers.Tokenizer``.
    ``prompt_token_ids`` is accepted for API parity and deliberately unused (see the
    module docstring). ``spaces_between_special_tokens`` only matters for slow
    tokenizers; fast ones decode in Rust, where transformers ignores it as well.
    """

    __slots__ = ("_tokenizer", "_backend", "_skip", "_spaces", "_ids", "_stepper",
                 "_pieces", "_pending")

    def __init__(self, tokenizer: Any, prompt_token_ids: Sequence[int] | None = None,
                 skip_special_tokens: bool = True, spaces_between_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._backend = fast_backend(tokenizer)
        self._skip = skip_special_tokens
        self._spaces = spaces_between_special_tokens
        self._ids: list[int] = []  # output token ids so far
        table = None if self._backend is None else byte_level_table(self._backend, skip_special_tokens)
        self._stepper: _Stepper
        if table is not None:
            self._stepper = _ByteLevelStream(table)
        elif self._backend is not None:
            self._stepper = _RustStream(self._backend, skip_special_tokens, self._ids)
        else:
            self._stepper = _WindowDecoder(tokenizer, skip_special_tokens, spaces_between_special_tokens, self._ids)
        self._pieces: list[str] = []  # every non-empty piece returned, in order
        self._pending = 0  # ids pushed since the last returned piece

    @property
    def output_token_ids(self) -> list[int]:
        return self._ids

    @property
    def text(self) -> str:
        """All text returned so far (joined on demand: O(len) per call)."""
        return "".join(self._pieces)

    def _decode(self, ids: Sequence[int]) -> str:
        if self._backend is not None:
            return self._backend.decode(list(ids), skip_special_tokens=self._skip)
        return self._tokenizer.decode(
            list(ids), skip_special_tokens=self._skip,
            spaces_between_special_tokens=self._spaces, clean_up_tokenization_spaces=False,
        )

    def push(self, token_ids: Sequence[int]) -> str:
        """Add output ids; return the text they complete ('' while a character is split)."""
        if len(token_ids) == 1:  # the per-token case of a decode step, without the loop's lists
            tid = token_ids[0]
            self._ids.append(tid)
            piece = self._stepper.step(tid)
            if piece is None:
                self._pending += 1
                return ""
            self._pending = 0
            if piece:
                self._pieces.append(piece)
            return piece
        out: list[str] = []
        for tid in token_ids:
            self._ids.append(tid)
            piece = self._stepper.step(tid)
            if piece is None:
                self._pending += 1
            else:
                self._pending = 0
                if piece:
                    out.append(piece)
        self._pieces.extend(out)
        return "".join(out)

    def flush(self) -> str:
        """Text still held back at the end of the request (e.g. an unfinished character)."""
        if isinstance(self._stepper, _ByteLevelStream):  # its decoder may hold bytes whatever it returned
            self._pending = 0
            tail = self._stepper.flush()
            if tail:
                self._pieces.append(tail)
            return tail
        if self._pending == 0:
            return ""
        sent = self.text
        full = self._decode(self._ids)
        if full.startswith(sent):
            tail = full[len(sent):]
        else:
            # The ByteFallback case from the module docstring: decode the held ids with a
            # little left context instead.
            held = self._ids[len(self._ids) - self._pending:]
            ctx = self._ids[max(0, len(self._ids) - self._pending - _CONTEXT): len(self._ids) - self._pending]
            pre, both = self._decode(ctx), self._decode(ctx + held)
            tail = both[len(pre):] if both.startswith(pre) else self._decode(held)
        self._pending = 0
        if tail:
            self._pieces.append(tail)
        return tail
