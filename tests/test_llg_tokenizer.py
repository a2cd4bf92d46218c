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
