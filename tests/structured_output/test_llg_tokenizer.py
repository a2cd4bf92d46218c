"""The llguidance view of a byte-level tokenizer whose decoder transformers wrote as a Llama-style
chain (transformers < 5.24 converts a GGUF's byte-level vocabulary that way; the H200 image's 5.17
did, and every JSON-constrained request with a space failed)."""

import copy

import pytest

pytest.importorskip("llguidance")

from tokenizers import decoders  # noqa: E402

from aioinfer.structured_output.compiler import GrammarCompiler  # noqa: E402
from aioinfer.structured_output.llg_tokenizer import byte_level_decoder_fixed  # noqa: E402
from aioinfer.structured_output.params import StructuredOutputsParams  # noqa: E402


def _with_llama_style_decoder(tokenizer):
    legacy = copy.deepcopy(tokenizer)
    legacy.backend_tokenizer.decoder = decoders.Sequence([
        decoders.ByteFallback(), decoders.Fuse(), decoders.Replace("▁", " "), decoders.ByteLevel()])
    return legacy


@pytest.mark.parametrize("legacy", [False, True], ids=["byte-level decoder", "llama-style chain"])
def test_space_tokens_are_bytes_and_the_grammar_accepts_them(smollm2_tokenizer, legacy):
    tokenizer = _with_llama_style_decoder(smollm2_tokenizer) if legacy else smollm2_tokenizer
    compiler = GrammarCompiler(tokenizer, len(smollm2_tokenizer), [smollm2_tokenizer.eos_token_id])
    text = '{"status": "ok", "items": [1, 2]}'
    ids = smollm2_tokenizer.encode(text, add_special_tokens=False)
    assert any(smollm2_tokenizer.convert_ids_to_tokens(i).startswith("Ġ") for i in ids)
    assert compiler.llg_tokenizer().decode_bytes(ids) == text.encode()
    matcher = compiler.compile(StructuredOutputsParams(json={
        "type": "object", "properties": {"status": {"type": "string"}, "items": {"type": "array"}},
        "required": ["status", "items"]}))
    # llguidance's default JSON separators are ", " and ": ", which the text uses
    assert matcher.consume_tokens(ids), matcher.get_error()
    assert matcher.is_accepting()


def test_decoder_fix_leaves_other_tokenizers_alone():
    sentencepiece = {"pre_tokenizer": {"type": "Metaspace"},
                     "decoder": {"type": "Sequence", "decoders": [{"type": "ByteFallback"}, {"type": "Fuse"}]}}
    assert byte_level_decoder_fixed(sentencepiece) is sentencepiece
    plain = {"pre_tokenizer": {"type": "ByteLevel"}, "decoder": {"type": "ByteLevel"}}
    assert byte_level_decoder_fixed(plain) is plain
    chained = {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Split"}, {"type": "ByteLevel"}]},
               "decoder": {"type": "Sequence", "decoders": [{"type": "Fuse"}, {"type": "ByteLevel", "x": 1}]}}
    assert byte_level_decoder_fixed(chained)["decoder"] == {"type": "ByteLevel", "x": 1}


def test_non_special_added_tokens_are_text_when_the_vocabulary_spells_them():
    """llguidance takes every added token as special; those marked ``"special": false`` whose
    byte-level vocabulary entry is their own text are left out of its ``added_tokens`` (so that they
    are text to a grammar); special ones, and any whose entry is not their text, stay."""
    from aioinfer.structured_output.llg_tokenizer import text_added_tokens_as_text

    spec = {"pre_tokenizer": {"type": "ByteLevel"},
            "model": {"type": "BPE", "vocab": {"<tool_call>": 5, "<|im_end|>": 6, "ĠA": 7, "x": 8}},
            "added_tokens": [{"id": 5, "content": "<tool_call>", "special": False},
                             {"id": 6, "content": "<|im_end|>", "special": True},
                             {"id": 7, "content": " A", "special": False},  # its entry is "ĠA": byte-level of " A"
                             {"id": 9, "content": "y z", "special": False}]}  # not in the vocabulary
    assert [t["id"] for t in text_added_tokens_as_text(spec)["added_tokens"]] == [6, 9]
    metaspace = {**spec, "pre_tokenizer": {"type": "Metaspace"}}  # not byte-level: left alone
    assert text_added_tokens_as_text(metaspace) is metaspace


@pytest.mark.slow
def test_qwen25_tool_call_token_triggers_a_structural_tag(qwen25_coder_gguf):
    """Qwen2.5 writes ``<tool_call>`` as one added, non-special token: a structural tag triggered by
    that text takes it (it used to refuse it, steering the model to spell the tag in pieces), then
    holds the call to its schema."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(qwen25_coder_gguf.parent, gguf_file=qwen25_coder_gguf.name)
    compiler = GrammarCompiler(tokenizer, 151936, [tokenizer.convert_tokens_to_ids("<|im_end|>")])
    weather = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
               "additionalProperties": False}
    tag = {"structures": [{"begin": '<tool_call>\n{"name": "get_weather", "arguments": ', "schema": weather,
                           "end": "}\n</tool_call>"}], "triggers": ["<tool_call>"]}
    call = 'Sure.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    ids = tokenizer.encode(call, add_special_tokens=False)
    assert tokenizer.convert_tokens_to_ids("<tool_call>") in ids  # one token, not pieces
    matcher = compiler.compile(StructuredOutputsParams(structural_tag=tag))
    assert matcher.consume_tokens(ids), matcher.get_error()
    wrong = tokenizer.encode('Sure.<tool_call>\n{"name": "get_weather", "arguments": {"town": "Paris"}}',
                             add_special_tokens=False)
    assert not compiler.compile(StructuredOutputsParams(structural_tag=tag)).consume_tokens(wrong)
    assert compiler.llg_tokenizer().is_special_token(tokenizer.convert_tokens_to_ids("<|im_end|>"))
