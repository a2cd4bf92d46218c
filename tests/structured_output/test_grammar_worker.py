"""The grammar worker thread (structured_output/grammar_worker.py): masks computed there equal masks computed on
the calling thread, the matchers take the collected tokens first, an error reaches the engine, and
the thread ends when its owner closes it or is dropped (an engine per test must not leave one)."""

from __future__ import annotations

import gc
import threading

import pytest
import torch

from aioinfer import SamplingParams
from aioinfer.structured_output import StructuredOutputsParams
from aioinfer.structured_output.compiler import GrammarCompiler
from aioinfer.structured_output.grammar_mask import GrammarMasks
from aioinfer.structured_output.grammar_worker import GrammarWorker, HANDOFF, MaskJob
from aioinfer.sample.sampling_metadata import SamplingRow

VOCAB = 49152


def _rows(compiler, constraints):
    return [SamplingRow(SamplingParams(), [1], [], 0, (2,), grammar=compiler.compile(c)) for c in constraints]


def _grammar_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "aioinfer-grammar"]


def test_worker_masks_equal_inline_masks_after_the_same_tokens(smollm2_tokenizer):
    compiler = GrammarCompiler(smollm2_tokenizer, VOCAB, [2])
    constraints = [StructuredOutputsParams(regex=r"[a-c]{2,5}"), StructuredOutputsParams(choice=["alpha", "beta"]),
                   StructuredOutputsParams(json={"type": "object", "properties": {"n": {"type": "integer"}}})]
    first = [smollm2_tokenizer.encode(text, add_special_tokens=False)[0] for text in ("a", "al", "{")]
    inline, deferred = _rows(compiler, constraints), _rows(compiler, constraints)
    masks = GrammarMasks(VOCAB, torch.device("cpu"))
    try:
        for row, token in zip(inline, first):
            assert row.grammar.consume_token(token)
        expected = masks.finish_fill(masks.plan(inline)).bits.clone()

        pending = masks.plan(deferred, tokens_known=False)
        masks.start(pending, [(row.grammar, token) for row, token in zip(deferred, first)])
        assert pending.job is not None
        got = masks.finish_fill(pending).bits
        assert torch.equal(got, expected)
        assert masks.num_fills == 1 and masks.fill_seconds >= 0.0
        assert not all(bool((got[k] == -1).all()) for k in range(len(constraints)))  # not all allowed
    finally:
        masks.close()


def test_a_failing_job_raises_on_the_engine_thread_and_the_worker_goes_on(smollm2_tokenizer):
    compiler = GrammarCompiler(smollm2_tokenizer, VOCAB, [2])
    worker = GrammarWorker(1, None, HANDOFF)
    try:
        buffer = torch.empty((1, (VOCAB + 31) // 32), dtype=torch.int32)
        bad = MaskJob((), [("not a matcher", 0)], [], buffer.data_ptr(), buffer.shape[1] * 4, 1)
        worker.submit(bad)
        with pytest.raises(Exception):
            bad.wait()
        matcher = compiler.compile(StructuredOutputsParams(choice=["yes"]))
        good = MaskJob((), [(matcher, 0)], [], buffer.data_ptr(), buffer.shape[1] * 4, 1)
        worker.submit(good)
        good.wait()
        assert good.is_done() and good.error is None and good.finished >= good.started
        yes = smollm2_tokenizer.encode("yes", add_special_tokens=False)[0]
        assert (int(buffer[0, yes // 32]) >> (yes % 32)) & 1
    finally:
        worker.close()


def test_the_thread_ends_on_close_and_when_dropped():
    before = set(_grammar_threads())
    closed = GrammarWorker(1, None, HANDOFF)
    dropped = GrammarWorker(1, None, HANDOFF)
    threads = set(_grammar_threads()) - before
    assert len(threads) == 2
    closed.close()
    del dropped
    gc.collect()
    for thread in threads:
        thread.join(timeout=60)
        assert not thread.is_alive()
