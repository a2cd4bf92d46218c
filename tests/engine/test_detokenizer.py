"""Incremental detokenizer, stop strings and TextAccumulator on real tokenizers.

Tokenizers: SmolLM2's (byte-level BPE, from the real GGUF) and two SentencePiece-style
byte-fallback BPE tokenizers built here with `tokenizers` (Llama-2 layout: Prepend/
Replace normalizer + Strip decoder; Metaspace layout: Metaspace pre-tokenizer/decoder).
"""

from __future__ import annotations

import json
import random

import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from aioinfer.text.detokenizer import IncrementalDetokenizer, fast_backend
from aioinfer.text.stop_strings import StopChecker
from aioinfer.text.text_accumulator import TextAccumulator, TextDelta

TEXTS = [
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "你好，世界。今天天气很好，我们去公园散步吧。",
    "日本語のテキストです。カタカナとひらがな、漢字。",
    "Family 👨‍👩‍👧 and flags 🇯🇵🇫🇷🏳️‍🌈 and 😀😃🤖 skin 👍🏽",
    "Mixed 混合 テキスト with é, ñ, ß, Ω, ℝ and a\u0301 combining",
    "   leading spaces\n\nnewlines\n\t tabs   trailing  ",
    "\n\nStarts with newlines",
    " x",
    "before<|im_end|>after <|im_start|>assistant\n你好<|im_end|>",
    "code:\n```python\ndef f(x):\n    return x ** 2  # 平方\n```\n",
]

SP_CORPUS = [
    "Hello world, this is a tiny corpus for a test tokenizer.",
    "The quick brown fox jumps over the lazy dog. " * 3,
    "Streaming detokenizers must handle spaces, newlines\nand   runs of spaces.",
    "日本語 テキスト と 中文 文本 世界",
    "numbers 12345 67890 and punctuation !?.,;: assistant before after",
]


def build_sentencepiece_style(layout: str) -> Tokenizer:
    """A small BPE with <0xNN> byte fallback, laid out like Llama-2 or like Metaspace."""
    base = Tokenizer(models.BPE(unk_token="<unk>"))
    if layout == "llama2":
        base.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    else:
        base.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    base.train_from_iterator(SP_CORPUS, trainers.BpeTrainer(vocab_size=300, limit_alphabet=60,
                                                            special_tokens=["<unk>"]))
    trained = json.loads(base.to_str())["model"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):  # ids 3..258, as in Llama-2
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for piece in trained["vocab"]:
        vocab.setdefault(piece, len(vocab))
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in trained["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    if layout == "llama2":
        tok.normalizer = base.normalizer
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                         decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    else:
        tok.pre_tokenizer = base.pre_tokenizer
        tok.decoder = decoders.Sequence([decoders.ByteFallback(),
                                         decoders.Metaspace(replacement="▁", prepend_scheme="first", split=False)])
    tok.add_special_tokens([AddedToken(t, special=True) for t in ("<s>", "</s>", "<|im_start|>", "<|im_end|>")])
    return tok


@pytest.fixture(scope="module")
def sp_tokenizers():
    from transformers import PreTrainedTokenizerFast

    return {
        layout: PreTrainedTokenizerFast(tokenizer_object=build_sentencepiece_style(layout),
                                        bos_token="<s>", eos_token="</s>", unk_token="<unk>")
        for layout in ("llama2", "metaspace")
    }


@pytest.fixture(params=["smollm2", "sp-llama2", "sp-metaspace"])
def tokenizer(request, smollm2_tokenizer, sp_tokenizers):
    if request.param == "smollm2":
        return smollm2_tokenizer
    return sp_tokenizers[request.param.removeprefix("sp-")]


class SlowOnly:
    """A tokenizer with no Rust backend in reach: forces the windowed fallback decoder."""

    def __init__(self, tok):
        self._tok = tok

    def decode(self, ids, **kwargs):
        kwargs.pop("spaces_between_special_tokens", None)
        return self._tok.decode(ids, **kwargs)


def stream(tok, ids, chunks, skip=True, prompt=(1, 2, 3)):
    """Push ids in chunks (an int size, or a random.Random for random sizes); return pieces."""
    det = IncrementalDetokenizer(tok, list(prompt), skip_special_tokens=skip)
    pieces, i = [], 0
    while i < len(ids):
        n = chunks.randint(1, 4) if isinstance(chunks, random.Random) else chunks
        pieces.append(det.push(ids[i:i + n]))
        i += n
    pieces.append(det.flush())
    assert det.text == "".join(pieces)
    assert det.output_token_ids == list(ids)
    return pieces


def is_prefix_stable(tok, ids, skip):
    """True when no later id rewrites earlier complete text (see detokenizer docstring)."""
    full = tok.decode(ids, skip_special_tokens=skip)
    return all(full.startswith(tok.decode(ids[:k], skip_special_tokens=skip).rstrip("\ufffd"))
               for k in range(1, len(ids)))


# --- incremental detokenizer ---------------------------------------------------------


def test_backend_is_used(tokenizer):
    assert fast_backend(tokenizer) is not None
    assert fast_backend(SlowOnly(tokenizer)) is None


@pytest.mark.parametrize("skip", [True, False])
@pytest.mark.parametrize("chunks", [1, 2, 3, 7, "random"])
def test_stream_equals_full_decode(tokenizer, skip, chunks):
    rng = random.Random(0)
    for text in TEXTS:
        ids = tokenizer.encode(text, add_special_tokens=False)
        ref = tokenizer.decode(ids, skip_special_tokens=skip)
        assert "\ufffd" not in ref
        for tok in (tokenizer, SlowOnly(tokenizer)):
            pieces = stream(tok, ids, rng if chunks == "random" else chunks, skip)
            assert "".join(pieces) == ref, (text, pieces)
            # Valid text never shows a broken character, not even transiently.
            assert not any("\ufffd" in p for p in pieces), pieces


def test_split_character_is_held_back(smollm2_tokenizer):
    tok = smollm2_tokenizer
    ids = tok.encode("👨‍👩‍👧", add_special_tokens=False)
    assert len(ids) > 3  # many byte-level tokens
    det = IncrementalDetokenizer(tok, [])
    pieces = [det.push([i]) for i in ids]
    assert "".join(pieces) == "👨‍👩‍👧"
    assert "" in pieces  # some tokens completed nothing yet
    for p in pieces:
        assert "\ufffd" not in p


def test_incomplete_tail_is_flushed_as_decode_does(tokenizer):
    ids = tokenizer.encode("ok 🤖", add_special_tokens=False)
    ids = ids[:-1]  # cut inside the emoji's bytes
    det = IncrementalDetokenizer(tokenizer, [])
    streamed = det.push(ids)
    assert not streamed.endswith("\ufffd")
    assert streamed + det.flush() == tokenizer.decode(ids)
    assert det.flush() == ""  # idempotent


def test_special_tokens_in_the_middle(tokenizer):
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    ids = tokenizer.encode("Hi there", add_special_tokens=False) + [im_end] + \
        tokenizer.encode(" 世界", add_special_tokens=False)
    assert "".join(stream(tokenizer, ids, 1, skip=True)) == tokenizer.decode(ids, skip_special_tokens=True)
    kept = "".join(stream(tokenizer, ids, 1, skip=False))
    assert kept == tokenizer.decode(ids, skip_special_tokens=False)
    assert "<|im_end|>" in kept


def test_metaspace_first_token_has_no_leading_space(sp_tokenizers):
    tok = sp_tokenizers["llama2"]
    ids = tok.encode("Hello world", add_special_tokens=False)
    assert tok.convert_ids_to_tokens(ids)[0].startswith("▁")
    pieces = stream(tok, ids, 1, prompt=tok.encode("The fox", add_special_tokens=False))
    assert pieces[0][:1] == "H"  # "▁He..." -> "He...", as decode(ids) renders it
    assert "".join(pieces) == "Hello world" == tok.decode(ids)


def test_random_ids_from_real_vocab(smollm2_tokenizer):
    """Random ids hit every awkward boundary: stray continuation bytes, specials, ..."""
    tok = smollm2_tokenizer
    rng = random.Random(1234)
    vocab = len(tok)
    for trial in range(600):
        n = rng.randint(1, 48)
        if trial % 2:  # low ids are single bytes in byte-level BPE: many split characters
            ids = [rng.randrange(300) if rng.random() < 0.7 else rng.randrange(vocab) for _ in range(n)]
        else:
            ids = [rng.randrange(vocab) for _ in range(n)]
        skip = bool(trial % 3)
        ref = tok.decode(ids, skip_special_tokens=skip)
        assert "".join(stream(tok, ids, rng, skip)) == ref, ids
        if trial % 5 == 0:
            assert "".join(stream(SlowOnly(tok), ids, rng, skip)) == ref, ids


@pytest.mark.parametrize("layout", ["llama2", "metaspace"])
def test_random_ids_sentencepiece_style(sp_tokenizers, layout):
    tok = sp_tokenizers[layout]
    rng = random.Random(99)
    vocab = len(tok)
    stable = 0
    for trial in range(800):
        ids = [rng.randrange(300) if rng.random() < 0.5 else rng.randrange(vocab)
               for _ in range(rng.randint(1, 40))]
        skip = bool(trial % 2)
        for t in (tok, SlowOnly(tok)):
            out = "".join(stream(t, ids, rng, skip))  # never raises, even when not stable
            if is_prefix_stable(tok, ids, skip):
                assert out == tok.decode(ids, skip_special_tokens=skip), ids
                stable += 1
    assert stable > 200


@pytest.mark.parametrize("layout", ["llama2", "metaspace"])
def test_valid_byte_fallback_runs(sp_tokenizers, layout):
    """Ordinary pieces mixed with complete <0xNN> runs: exact, for any chunking."""
    tok = sp_tokenizers[layout]
    rng = random.Random(7)
    normal = [i for i in range(259, len(tok)) if tok.convert_ids_to_tokens(i) not in ("<|im_start|>", "<|im_end|>")]
    for trial in range(400):
        ids = []
        for _ in range(rng.randint(1, 25)):
            r = rng.random()
            if r < 0.3:
                ids += [3 + b for b in rng.choice("世界😀é👨‍👩‍👧🇯🇵").encode()]
            elif r < 0.35:
                ids.append(rng.choice([1, 2, tok.convert_tokens_to_ids("<|im_end|>")]))
            else:
                ids.append(rng.choice(normal))
        skip = bool(trial % 2)
        ref = tok.decode(ids, skip_special_tokens=skip)
        pieces = stream(tok, ids, rng, skip)
        assert "".join(pieces) == ref, ids
        assert not any("\ufffd" in p for p in pieces)


# --- stop strings ----------------------------------------------------------------------


def test_stop_checker_basics():
    c = StopChecker(["END", "\n\n"], include_stop_str_in_output=False)
    assert c.max_holdback == 2
    assert c.check("no stop here", 12) is None
    m = c.check("abc END def", 11)
    assert (m.stop, m.start, m.truncate_at) == ("END", 4, 4)
    # Already-checked text is not searched again: only matches reaching the new chars count.
    assert c.check("abc END def", 3) is None
    m = c.check("abc EN", 2)
    assert m is None and c.holdback("abc EN") == 2
    m = c.check("abc END", 1)  # spans the old/new boundary
    assert m.start == 4
    inc = StopChecker(["END"], include_stop_str_in_output=True)
    assert inc.check("abc END def", 11).truncate_at == 7


def test_stop_checker_earliest_wins():
    c = StopChecker(["world", "lo w", "o"], include_stop_str_in_output=False)
    m = c.check("hello world", 11)
    assert (m.stop, m.start) == ("o", 4)  # ends first
    c = StopChecker(["abc", "bc"], include_stop_str_in_output=False)
    m = c.check("xabc", 4)  # both end at 4: the earlier start cuts more
    assert (m.stop, m.truncate_at) == ("abc", 1)
    assert StopChecker([], False).check("anything", 8) is None
    with pytest.raises(ValueError):
        StopChecker([""], False)


def test_holdback_is_only_a_possible_stop_prefix():
    c = StopChecker(["</answer>", "STOP"], include_stop_str_in_output=False)
    assert c.holdback("text </ans") == 5
    assert c.holdback("text ST") == 2
    assert c.holdback("text S") == 1
    assert c.holdback("text") == 0  # released at once: cannot start a stop string
    assert c.holdback("<") == 1
    assert c.holdback("text </answer") == 8


def _expected(full: str, stops: list[str], include: bool) -> tuple[str, str | None]:
    """Brute force: the first character position where some stop string has ended."""
    for end in range(1, len(full) + 1):
        hits = [(end - len(s), s) for s in stops if full[:end].endswith(s)]
        if hits:
            start, s = min(hits)
            return (full[:end] if include else full[:start]), s
    return full, None


def _run_output(tok, ids, rng, **kw):
    out = TextAccumulator(tok, [1, 2], **kw)
    deltas, i = [], 0
    while i < len(ids) and not out.stopped:
        n = rng.randint(1, 3)
        d = out.append(ids[i:i + n])
        assert isinstance(d, TextDelta)
        deltas.append(d.new_text)
        assert "".join(deltas) == out.text  # what was sent is never taken back
        i += n
    deltas.append(out.finish())
    return out, "".join(deltas)


@pytest.mark.parametrize("include", [False, True])
def test_output_text_stop_cases(smollm2_tokenizer, include):
    tok = smollm2_tokenizer
    rng = random.Random(5)
    text = "The answer is 42. END of the answer, 世界 and 👨‍👩‍👧 done.\n\nBye"
    ids = tok.encode(text, add_special_tokens=False)
    cases = [
        ["END"],  # spans tokens
        ["The"],  # at the very start
        ["answer, 世", "END"],  # several: earliest wins
        ["世界"],  # multibyte, split over byte-level tokens
        ["👩"],  # inside a ZWJ sequence
        ["\n\n"],
        ["Bye"],  # at the very end
        ["not present", "zzz"],  # no stop: everything flushed at finish
        ["e"],
    ]
    for stops in cases:
        out, streamed = _run_output(tok, ids, rng, stop=stops, include_stop_str_in_output=include)
        want, reason = _expected(text, stops, include)
        assert streamed == out.text == want, stops
        assert out.stop_reason == reason and out.stopped == (reason is not None)
        assert out.append(ids[:2]) == TextDelta("", out.stopped, reason)  # finished: inert
        assert out.finish() == ""


def test_output_text_holds_back_only_possible_stops(smollm2_tokenizer):
    tok = smollm2_tokenizer
    out = TextAccumulator(tok, [], stop=["</answer>"])
    sent = ""
    for piece in ["The", " result", " </", "ans", "wer", "> tail"]:
        sent += out.append(tok.encode(piece, add_special_tokens=False)).new_text
        assert "<" not in sent  # the would-be stop is never sent early
    assert sent == "The result " and out.stopped and out.stop_reason == "</answer>"

    out = TextAccumulator(tok, [], stop=["</answer>"])
    d = out.append(tok.encode("a </ans", add_special_tokens=False))
    assert d.new_text == "a " and not d.stopped
    d = out.append(tok.encode("x> b", add_special_tokens=False))  # not a stop after all
    assert d.new_text == "</ansx> b"
    assert out.finish() == "" and out.text == "a </ansx> b"

    out = TextAccumulator(tok, [], stop=["STOP"])  # ends for another reason while holding "ST"
    assert out.append(tok.encode("go ST", add_special_tokens=False)).new_text == "go "
    assert out.finish() == "ST" and out.text == "go ST" and not out.stopped


def test_output_text_random_stops(smollm2_tokenizer, sp_tokenizers):
    """Random texts, random stop strings cut from them, random batching: exact results."""
    rng = random.Random(2024)
    for tok in (smollm2_tokenizer, sp_tokenizers["llama2"]):
        for trial in range(150):
            text = " ".join(rng.sample(TEXTS, 2))
            ids = tok.encode(text, add_special_tokens=False)
            full = tok.decode(ids, skip_special_tokens=True)
            stops = []
            for _ in range(rng.randint(0, 3)):
                a = rng.randrange(len(full))
                stops.append(full[a:a + rng.randint(1, 6)])
            if rng.random() < 0.3:
                stops.append("never appears ☃")
            include = bool(trial % 2)
            out, streamed = _run_output(tok, ids, rng, stop=stops, include_stop_str_in_output=include)
            want, reason = _expected(full, stops, include)
            assert streamed == out.text == want, (text, stops)
            assert out.stop_reason == reason


def test_output_text_without_stops_equals_decode(tokenizer):
    rng = random.Random(3)
    for text in TEXTS:
        ids = tokenizer.encode(text, add_special_tokens=False)
        out, streamed = _run_output(tokenizer, ids, rng)
        assert streamed == out.text == tokenizer.decode(ids, skip_special_tokens=True)
        assert not out.stopped


def test_accumulator_from_sampling_params(smollm2_tokenizer):
    from aioinfer.sampling_params import SamplingParams

    tok = smollm2_tokenizer
    params = SamplingParams(stop=["world"], include_stop_str_in_output=True, skip_special_tokens=False)
    ids = tok.encode("<|im_start|>hello world again", add_special_tokens=False)
    acc = TextAccumulator(tok, [1, 2], params)
    sent = "".join(acc.append([i]).new_text for i in ids) + acc.finish()
    assert sent == acc.text == "<|im_start|>hello world" and acc.stop_reason == "world"


# --- the byte-level table (Qwen2.5, Llama 3, SmolLM2) -------------------------------------


def test_byte_level_tokenizers_take_the_table_path(smollm2_tokenizer, sp_tokenizers):
    from aioinfer.text.detokenizer import _ByteLevelStream, _RustStream, _WindowDecoder

    assert isinstance(IncrementalDetokenizer(smollm2_tokenizer, [])._stepper, _ByteLevelStream)
    for tok in sp_tokenizers.values():  # ByteFallback / Metaspace decoders: the Rust stream
        assert isinstance(IncrementalDetokenizer(tok, [])._stepper, _RustStream)
    assert isinstance(IncrementalDetokenizer(SlowOnly(smollm2_tokenizer), [])._stepper, _WindowDecoder)


@pytest.mark.parametrize("skip", [True, False])
def test_byte_level_table_is_decode_of_every_id(smollm2_tokenizer, skip):
    """Each id's bytes decode as the Rust decoder renders that id alone (specials skipped or kept)."""
    from aioinfer.text.detokenizer import byte_level_table

    backend = fast_backend(smollm2_tokenizer)
    table = byte_level_table(backend, skip)
    assert table is byte_level_table(backend, skip)  # built once
    assert len(table.raw) == len(table.texts) == backend.get_vocab_size(with_added_tokens=True)
    for token_id, (raw, text) in enumerate(zip(table.raw, table.texts)):
        assert raw.decode("utf-8", "replace") == backend.decode([token_id], skip_special_tokens=skip), token_id
        assert text is None or text == raw.decode("utf-8")


def test_a_table_lives_as_long_as_its_tokenizer(smollm2_tokenizer):
    import gc

    from aioinfer.text import detokenizer

    backend = Tokenizer.from_str(fast_backend(smollm2_tokenizer).to_str())  # a second, private copy
    assert detokenizer.byte_level_table(backend, True) is not None
    key = (id(backend), True)
    assert key in detokenizer._tables
    del backend
    gc.collect()
    assert key not in detokenizer._tables


def test_ids_past_the_vocabulary_are_skipped_as_decode_does(smollm2_tokenizer):
    tok = smollm2_tokenizer
    ids = tok.encode("Hi 世界", add_special_tokens=False)
    past = len(tok) + 100  # a model's padded embedding rows can be sampled
    mixed = ids[:2] + [past] + ids[2:] + [past]
    assert "".join(stream(tok, mixed, 1)) == tok.decode(mixed) == "Hi 世界"


def test_byte_level_invalid_bytes_match_decode(smollm2_tokenizer):
    """Long runs of single-byte tokens: stray continuation bytes, truncated and overlong sequences,
    in any chunking, give what decode gives, and valid characters are never shown broken."""
    tok = smollm2_tokenizer
    backend = fast_backend(tok)
    single = {}
    for token_id in range(len(tok)):
        token = backend.id_to_token(token_id)
        if token is not None and len(token) == 1:
            single.setdefault(token, token_id)
    ids_by_char = list(single.values())
    rng = random.Random(5)
    for _ in range(300):
        ids = [rng.choice(ids_by_char) for _ in range(rng.randint(1, 60))]
        ref = tok.decode(ids, skip_special_tokens=True)
        assert "".join(stream(tok, ids, rng)) == ref, ids
