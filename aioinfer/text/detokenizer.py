"""Incremental detokenization: token ids in, newly decodable text out.

Contract (tested in tests/test_detokenizer.py): for one request, the concatenation of
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

Fast tokenizers use ``tokenizers.decoders.DecodeStream``, which does this in Rust over a
short sliding window of ids. Other tokenizers use the same windowed algorithm written
over ``tokenizer.decode`` (vLLM's classic prefix_offset/read_offset scheme).

Why the prompt does not prime the stream: for byte-level BPE (Qwen2.5, Llama 3,
SmolLM2) priming changes nothing, while for SentencePiece/Metaspace tokenizers it turns
the first token's "▁Hello" into " Hello", which ``decode(output_ids)`` renders "Hello";
the streamed and the non-streamed text would then disagree. The text of an output is
therefore defined as ``decode(output_ids)``, as in ``transformers``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Protocol

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

logger = logging.getLogger(__name__)

_REPLACEMENT = "\ufffd"  # what lossy UTF-8 decoding yields for an incomplete character
_CONTEXT = 6  # ids of left context when decoding a tail on its own (Metaspace spacing)


class _Stepper(Protocol):
    def step(self, token_id: int) -> str | None:
        """Feed the id just appended to the output; return the text it completes, or None."""


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
        self._stepper: _Stepper = (
            _RustStream(self._backend, skip_special_tokens, self._ids) if self._backend is not None
            else _WindowDecoder(tokenizer, skip_special_tokens, spaces_between_special_tokens, self._ids)
        )
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
