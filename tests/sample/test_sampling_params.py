"""Invalid options raise ValueError naming the field; valid ones are normalised as vLLM does."""

import pytest

from aioinfer import SamplingParams
from aioinfer.config import EngineConfig

BAD = [
    ("n", 0), ("n", 1.5), ("temperature", -0.1), ("temperature", float("nan")), ("top_p", 0.0), ("top_p", 1.5),
    ("top_k", -2), ("top_k", 2.5), ("min_p", -0.1), ("min_p", 1.1), ("seed", "x"), ("presence_penalty", 2.5),
    ("frequency_penalty", -3), ("repetition_penalty", 0.0), ("max_tokens", 0), ("max_tokens", True),
    ("min_tokens", -1), ("logprobs", -2), ("logprobs", 1.5),
    ("prompt_logprobs", -2), ("prompt_logprobs", 1.0), ("stop", [""]), ("stop_token_ids", [-1]),
    ("logit_bias", {1: 200}), ("logit_bias", {"a": 1}),
]


@pytest.mark.parametrize("field,value", BAD)
def test_invalid_values_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


def test_min_tokens_above_max_tokens():
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(min_tokens=5, max_tokens=2)


def test_normalisation():
    p = SamplingParams(temperature=0.0, top_k=5, top_p=0.5, stop="END", logit_bias={"3": 1})
    assert p.greedy and p.top_k == 0 and p.top_p == 1.0
    assert p.stop == ["END"] and p.logit_bias == {3: 1.0}
    assert SamplingParams(top_k=-1).top_k == 0


def test_vocab_checks():
    with pytest.raises(ValueError, match="stop_token_ids"):
        SamplingParams(stop_token_ids=[10]).validate_for_vocab(10)
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams(logit_bias={12: 1}).validate_for_vocab(10)


@pytest.mark.parametrize("kwargs,field", [
    ({"block_size": 0}, "block_size"), ({"max_num_seqs": 0}, "max_num_seqs"), ({"dtype": "int8"}, "dtype"),
    ({"max_num_batched_tokens": -5}, "max_num_batched_tokens"), ({"num_kv_blocks": 0}, "num_kv_blocks"),
    ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"), ({"load_format": "pt"}, "load_format"),
])
def test_engine_config_errors_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        EngineConfig.from_kwargs("m", **kwargs)


def test_unknown_engine_option():
    with pytest.raises(TypeError, match="bogus"):
        EngineConfig.from_kwargs("m", bogus=1)


def test_clone_is_equal_and_shares_nothing_mutable():
    import dataclasses

    original = SamplingParams(n=3, temperature=0.7, top_k=5, seed=9, stop=["x", "y"], stop_token_ids=[4, 5],
                              logit_bias={3: 1.5}, logprobs=2, max_tokens=7)
    copy = original.clone()
    assert copy == original
    for f in dataclasses.fields(SamplingParams):  # every field, private ones too
        assert getattr(copy, f.name) == getattr(original, f.name), f.name
    copy.stop.append("z")
    copy.stop_token_ids.append(6)
    copy.logit_bias[8] = -1.0
    copy.n = 1
    assert original.stop == ["x", "y"] and original.stop_token_ids == [4, 5] and original.logit_bias == {3: 1.5}
    assert original.n == 3
    assert SamplingParams(max_tokens=3).clone().logit_bias is None
