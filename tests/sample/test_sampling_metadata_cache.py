"""A runner's ``SamplingMetadataCache``: while a step's rows are the very rows of the step before, in
the same order, the params' tensors are reused and the metadata still equals ``SamplingMetadata.build``
of that step (noise positions, min_tokens and penalties move with every token); any other rows get
their own."""

from __future__ import annotations

import dataclasses

import torch

from aioinfer.sampling_params import SamplingParams
from aioinfer.sample.sampling_metadata import SamplingMetadata, SamplingMetadataCache, SamplingRow

V = 40
CPU = torch.device("cpu")


def _rows() -> list[SamplingRow]:
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.7, top_k=5, top_p=0.8, min_p=0.05, seed=3),
        SamplingParams(temperature=1.0, logit_bias={4: 2.0, 9: -1.5}, min_tokens=2, stop_token_ids=[7]),
        SamplingParams(temperature=0.0, repetition_penalty=1.2, presence_penalty=0.5, logprobs=3),
        SamplingParams(temperature=0.9, frequency_penalty=0.3, min_tokens=1, ignore_eos=True, stop_token_ids=[8]),
    ]
    return [SamplingRow(p, [1, 2, 3 + i], [], seed=11 + i, eos_token_ids=(0,)) for i, p in enumerate(params)]


def _assert_same(got: SamplingMetadata, want: SamplingMetadata) -> None:
    for field in dataclasses.fields(SamplingMetadata):
        a, b = getattr(got, field.name), getattr(want, field.name)
        if field.name == "penalties" and a is not None and b is not None:
            for inner in dataclasses.fields(a):
                x, y = getattr(a, inner.name), getattr(b, inner.name)
                assert (x is None) == (y is None) and (x is None or torch.equal(x, y)), inner.name
        elif isinstance(b, torch.Tensor):
            assert isinstance(a, torch.Tensor) and torch.equal(a, b), field.name
        else:
            assert a == b, field.name


def test_the_same_rows_reuse_the_knobs_and_equal_a_fresh_build_at_every_step():
    rows = _rows()
    cache = SamplingMetadataCache()
    first = None
    for step in range(4):
        states = list(rows)  # a new list of the same rows, as the runner makes every step
        got = cache.build(states, V, CPU)
        _assert_same(got, SamplingMetadata.build(states, V, CPU))
        if first is None:
            first = got
            assert got.min_tokens_index is not None  # rows 2 and 4 are short of their min_tokens
        else:
            assert got.temperature is first.temperature and got.bias_index is first.bias_index
            assert not torch.equal(got.noise_keys, first.noise_keys)  # each row's next noise position
        for i, row in enumerate(rows):
            row.output_token_ids.append(5 + (i + step) % 3)
    assert got.min_tokens_index is None  # both past their min_tokens by now


def test_other_rows_get_their_own_knobs():
    rows = _rows()
    cache = SamplingMetadataCache()
    whole = cache.build(rows, V, CPU)
    fewer = rows[1:]  # a request finished: the rows move up
    got = cache.build(fewer, V, CPU)
    _assert_same(got, SamplingMetadata.build(fewer, V, CPU))
    assert got.temperature is not whole.temperature
    swapped = [rows[1], rows[0]] + rows[2:]  # the same rows in another order
    _assert_same(cache.build(swapped, V, CPU), SamplingMetadata.build(swapped, V, CPU))
    _assert_same(cache.build(rows, V + 1, CPU), SamplingMetadata.build(rows, V + 1, CPU))
