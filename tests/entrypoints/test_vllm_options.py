"""vLLM's common LLM options: renamed, accepted without effect, or refused naming the option; on the
real LLM and Engine constructors (a tiny model), and the table in docs/vllm_compatibility.md."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from aioinfer import LLM, SamplingParams
from aioinfer.async_engine.engine import Engine
from aioinfer.config import EngineConfig
from aioinfer.vllm_options import NO_EFFECT, ONLY_DEFAULT, RENAMED, translate
from tiny_models import make_tiny_model_dir

BASE = dict(device="cpu", dtype="float32", max_model_len=128, num_kv_blocks=16)
# A vLLM script's LLM(...) call, every option at a value aioinfer honours.
VLLM_STYLE = dict(trust_remote_code=True, swap_space=1, quantization=None, kv_cache_dtype="auto", max_logprobs=40,
                  enable_chunked_prefill=True, tokenizer_mode="auto", disable_log_stats=True, cpu_offload_gb=0,
                  pipeline_parallel_size=1, enable_lora=False, revision=None, seed=0, scheduling_policy="fcfs",
                  max_seq_len_to_capture=8192, generation_config="auto", distributed_executor_backend="mp")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(make_tiny_model_dir(tmp_path_factory.mktemp("qwen2"), arch="qwen2"))


def test_a_vllm_script_s_options_build_the_same_llm(model_dir):
    plain = LLM(model=model_dir, **BASE)
    vllm_style = LLM(model=model_dir, **BASE, **VLLM_STYLE)
    assert vllm_style.config.cache.swap_space_gib == 1
    params = SamplingParams(max_tokens=6, temperature=0)
    assert ([o.outputs[0].token_ids for o in vllm_style.generate(["Hello there"], params, use_tqdm=False)]
            == [o.outputs[0].token_ids for o in plain.generate(["Hello there"], params, use_tqdm=False)])


def test_quantization_takes_fp8_and_refuses_other_schemes(model_dir):
    # fp8 (online) is served; 4-bit and other schemes are refused by the option's own check
    for build in (lambda: LLM(model=model_dir, **BASE, quantization="awq"),
                  lambda: Engine(model_dir, **BASE, quantization="awq")):
        with pytest.raises(ValueError, match=r"quantization.*'awq'"):
            build()


@pytest.mark.parametrize("option, value", [("enable_lora", True),
                                           ("pipeline_parallel_size", 2), ("cpu_offload_gb", 4),
                                           ("enable_chunked_prefill", False)])
def test_options_that_would_change_the_result_are_refused_by_name(model_dir, option, value):
    for build in (lambda: LLM(model=model_dir, **BASE, **{option: value}),
                  lambda: Engine(model_dir, **BASE, **{option: value})):
        with pytest.raises(ValueError, match=rf"^{option}={re.escape(repr(value))} is not supported: "):
            build()


def test_kv_cache_dtype_takes_vllms_fp8_names_and_refuses_e5m2(model_dir):
    for value in ("fp8", "fp8_e4m3", "auto"):
        assert EngineConfig.from_kwargs("m", kv_cache_dtype=value).cache.kv_cache_dtype == value
    assert EngineConfig.from_kwargs("m", kv_cache_dtype="fp8").cache.fp8_kv_cache
    assert not EngineConfig.from_kwargs("m").cache.fp8_kv_cache
    for build in (lambda: LLM(model=model_dir, **BASE, kv_cache_dtype="fp8_e5m2"),
                  lambda: Engine(model_dir, **BASE, kv_cache_dtype="fp8_e5m2")):
        with pytest.raises(ValueError, match=r"^kv_cache_dtype 'fp8_e5m2' is not supported: .*e5m2"):
            build()
    with pytest.raises(ValueError, match=r"^kv_cache_dtype must be one of \('auto', 'fp8', 'fp8_e4m3'\)"):
        EngineConfig.from_kwargs("m", kv_cache_dtype="int8")


def test_unknown_options_stay_a_type_error(model_dir):
    with pytest.raises(TypeError, match="max_num_seqz"):
        LLM(model=model_dir, **BASE, max_num_seqz=4)


def test_translate():
    assert translate({"swap_space": 2, "trust_remote_code": True, "kv_cache_dtype": "fp8"}) == {
        "swap_space_gib": 2, "kv_cache_dtype": "fp8"}  # an option of aioinfer's own now: passed through
    with pytest.raises(ValueError, match="same option"):
        translate({"swap_space": 2, "swap_space_gib": 2})
    config = EngineConfig.from_kwargs("m", swap_space=3, max_logprobs=5)
    assert config.cache.swap_space_gib == 3 and config.model.max_logprobs == 5


def test_the_docs_table_lists_every_option():
    table = (Path(__file__).resolve().parents[2] / "docs" / "vllm_compatibility.md").read_text()
    for name in [*RENAMED, *NO_EFFECT, *ONLY_DEFAULT]:
        assert f"`{name}`" in table, name


def test_generation_config_auto_vllm_or_a_folder(model_dir, tmp_path):
    """vLLM's generation_config: the defaults of unset sampling fields from the model's
    generation_config.json (auto), from none (vllm), or from another folder's."""
    auto = LLM(model=model_dir, **BASE).get_default_sampling_params()
    assert (auto.temperature, auto.top_p, auto.top_k) == (0.7, 0.8, 20)  # tiny_models writes these
    assert LLM(model=model_dir, **BASE, generation_config="vllm").get_default_sampling_params() == SamplingParams()
    (tmp_path / "generation_config.json").write_text('{"temperature": 0.25, "top_k": 5, "eos_token_id": 3}')
    other = LLM(model=model_dir, **BASE, generation_config=str(tmp_path))
    defaults = other.get_default_sampling_params()
    assert (defaults.temperature, defaults.top_k, defaults.top_p) == (0.25, 5, 1.0)
    assert other.engine.loaded.eos_token_ids == LLM(model=model_dir, **BASE).engine.loaded.eos_token_ids  # the model's
    with pytest.raises(ValueError, match="generation_config"):
        EngineConfig.from_kwargs(model_dir, generation_config=str(tmp_path / "missing"))
