"""One engine load parses its GGUF once: the arch config, the weights and the tokenizer share it.

Parsing SmolLM2's metadata (49k tokens, 48k merges) took seconds, and a load did it three times:
the arch config, ``load_model``, and transformers' tokenizer loading (``load_gguf_checkpoint``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from aioinfer.models import gguf_loader


@pytest.fixture
def count_parses(monkeypatch):
    """Counts every ``gguf.GGUFReader`` parse (our subclass's included: it runs the base __init__)."""
    from gguf.gguf_reader import GGUFReader

    parsed: list[str] = []
    original = GGUFReader.__init__

    def counting_init(self, path, mode="r"):
        parsed.append(str(path))
        original(self, path, mode)

    monkeypatch.setattr(GGUFReader, "__init__", counting_init)
    return parsed


def write_tiny_gguf(path: Path, value: int) -> Path:
    import gguf

    writer = gguf.GGUFWriter(str(path), arch="llama")
    writer.add_uint32("test.value", value)
    writer.add_array("test.words", ["a", "bc", "déf"])
    writer.add_tensor("token_embd.weight", np.arange(12, dtype=np.float32).reshape(3, 4))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_the_plain_view_reader_reads_what_gguf_reads(tmp_path):
    from gguf.gguf_reader import GGUFReader

    path = write_tiny_gguf(tmp_path / "a.gguf", 7)
    ours, theirs = gguf_loader.open_gguf(path), GGUFReader(str(path))
    assert isinstance(ours, GGUFReader) and type(ours.data) is np.ndarray  # a plain view, not np.memmap
    assert list(ours.fields) == list(theirs.fields)
    for name in theirs.fields:
        assert ours.fields[name].contents() == theirs.fields[name].contents(), name
    (a,), (b,) = ours.tensors, theirs.tensors
    assert (a.name, a.tensor_type, a.data.shape) == (b.name, b.tensor_type, b.data.shape)
    assert np.array_equal(a.data, b.data) and not a.data.flags.writeable


def test_a_loan_serves_its_path_only_and_ends(tmp_path, count_parses):
    import gguf

    lent_path, other_path = write_tiny_gguf(tmp_path / "lent.gguf", 1), write_tiny_gguf(tmp_path / "other.gguf", 2)
    original = gguf.GGUFReader
    reader = gguf_loader.open_gguf(lent_path)
    with gguf_loader.lend_parsed_gguf(lent_path, reader):
        with gguf_loader.lend_parsed_gguf(lent_path, reader):  # loans nest (data-parallel replicas)
            assert gguf.GGUFReader(str(lent_path)) is reader
        assert gguf.GGUFReader(f"{tmp_path}/./lent.gguf") is reader  # the same file, spelt otherwise
        other = gguf.GGUFReader(str(other_path))
        assert other is not reader and other.fields["test.value"].contents() == 2
    assert gguf.GGUFReader is original
    assert count_parses == [str(lent_path), str(other_path)]


@pytest.mark.slow
def test_an_engine_load_parses_the_smollm2_gguf_once(smollm2_gguf, smollm2_tokenizer, count_parses):
    import gguf

    from aioinfer.config import EngineConfig
    from aioinfer.executor.model_setup import load_for_engine

    original = gguf.GGUFReader
    loaded = load_for_engine(EngineConfig.from_kwargs(str(smollm2_gguf), device="cpu", dtype="float32"))
    assert count_parses == [str(smollm2_gguf)]  # was three: arch config, weights, transformers' tokenizer
    assert gguf.GGUFReader is original
    # the tokenizer built from the lent reader is the one transformers builds on its own
    ours, reference = loaded.tokenizer, smollm2_tokenizer
    assert type(ours) is type(reference) and ours.get_vocab() == reference.get_vocab()
    assert ours.all_special_tokens == reference.all_special_tokens and ours.eos_token_id == reference.eos_token_id
    for text in ("Hello, world!", "  leading spaces\nand lines", "我们今天去公园散步，😀 🚀", "<|im_start|>user"):
        assert ours.encode(text) == reference.encode(text), text
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    assert (ours.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            == reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
    assert loaded.arch.vocab_size == 49152 and loaded.eos_token_ids[0] == 2
