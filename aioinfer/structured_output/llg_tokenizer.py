"""The llguidance view of a Hugging Face fast tokenizer.

llguidance reads the tokenizer's JSON and treats a vocabulary as byte-level (GPT-2's "Ġ" for a
space) when the decoder says ByteLevel. transformers before 5.24 converts a GGUF's byte-level
vocabulary (SmolLM2, Qwen2.5) with a Llama-style decoder chain, ``Sequence[ByteFallback, Fuse,
Replace("▁", " "), ByteLevel]``: llguidance then took "Ġ" as text and rejected every token with a
space in it (seen on the H200 image, transformers 5.17). With a ByteLevel pre-tokenizer the other
decoders of such a chain do nothing (no byte-fallback tokens or "▁" in a byte-level vocabulary), so
the view keeps the ByteLevel decoder alone.

llguidance also takes every entry of ``added_tokens`` as a special token, ``"special": false`` ones
too, and a special token is never text to a grammar. Qwen2.5's ``<tool_call>`` and ``</tool_call>``
are such entries: a structural tag triggered by ``"<tool_call>"`` refused the one token the model
writes it with, and steered it to spell the tag in pieces. A non-special added token that the
byte-level vocabulary holds under its own text is left out of the view's ``added_tokens``, so that
llguidance reads it as the text it is (the vocabulary keeps it; special tokens stay special).
"""

from __future__ import annotations

import json
from copy import copy
from typing import Optional, Sequence

from aioinfer.text.byte_level import byte_level_alphabet


def llg_tokenizer(hf_tokenizer, vocab_size: int, eos_token_ids: Optional[Sequence[int]]):
    import llguidance

    backend = getattr(hf_tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise ValueError("structured outputs need a fast (Rust) Hugging Face tokenizer")
    backend = copy(backend)
    backend.no_padding()
    backend.no_truncation()
    spec = text_added_tokens_as_text(byte_level_decoder_fixed(json.loads(backend.to_str())))
    eos = list(eos_token_ids) if eos_token_ids else hf_tokenizer.eos_token_id
    return llguidance.LLTokenizer(json.dumps(spec), n_vocab=vocab_size, eos_token=eos)


def byte_level_decoder_fixed(spec: dict) -> dict:
    """``spec`` (a tokenizer.json) with a decoder chain around ByteLevel cut to ByteLevel alone, when
    the pre-tokenizer is byte-level (see the module's docstring); otherwise unchanged."""
    decoder = spec.get("decoder") or {}
    if decoder.get("type") != "Sequence" or not _is_byte_level(spec.get("pre_tokenizer")):
        return spec
    byte_level = [d for d in decoder.get("decoders", []) if d.get("type") == "ByteLevel"]
    if not byte_level:
        return spec
    return {**spec, "decoder": byte_level[-1]}


def _is_byte_level(pre_tokenizer) -> bool:
    if not pre_tokenizer:
        return False
    if pre_tokenizer.get("type") == "ByteLevel":
        return True
    return pre_tokenizer.get("type") == "Sequence" and any(
        p.get("type") == "ByteLevel" for p in pre_tokenizer.get("pretokenizers", []))


def text_added_tokens_as_text(spec: dict) -> dict:
    """``spec`` without the non-special added tokens that its byte-level vocabulary holds under their
    own text (see the module's docstring); otherwise unchanged."""
    vocab = (spec.get("model") or {}).get("vocab")
    added = spec.get("added_tokens") or []
    if not isinstance(vocab, dict) or not _is_byte_level(spec.get("pre_tokenizer")):
        return spec
    as_byte_level = byte_level_alphabet()
    text_like = {token["id"] for token in added if not token.get("special")
                 and vocab.get("".join(as_byte_level[b] for b in token["content"].encode())) == token["id"]}
    if not text_like:
        return spec
    return {**spec, "added_tokens": [token for token in added if token["id"] not in text_like]}
