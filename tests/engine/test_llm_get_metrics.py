"""``LLM.get_metrics()``: vLLM's offline metrics (aioinfer.metrics_reader's Counter, Gauge, Histogram,
Vector), recorded by the server's own recorder from the offline engine's steps; and vLLM's example
offline_inference/metrics.py, whose calls are made here as it makes them."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client import Counter as PromCounter
from prometheus_client import Histogram as PromHistogram

from aioinfer import LLM, SamplingParams
from aioinfer.metrics_reader import Counter, Gauge, Histogram, Metric, Vector, read_metrics
from tiny_models import make_tiny_model_dir

MAX_TOKENS = 5
PROMPTS = ["Hello, my name is", "The capital of France is", "The future of AI is"]


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    model_dir = make_tiny_model_dir(tmp_path_factory.mktemp("qwen2"), arch="qwen2")
    with LLM(model=str(model_dir), dtype="float32", device="cpu", max_model_len=256, num_kv_blocks=64,
             cpu_threads=1) as llm:
        yield llm


def _one(metrics: list[Metric], kind: type, name: str, **labels: str) -> Metric:
    found = [m for m in metrics if isinstance(m, kind) and m.name == name
             and all(m.labels.get(k) == v for k, v in labels.items())]
    assert len(found) == 1, (name, labels, found)
    return found[0]


def _value(metrics: list[Metric], name: str, **labels: str) -> float:
    """A counter's or gauge's value, 0 when the series does not exist yet."""
    found = [m for m in metrics if isinstance(m, (Counter, Gauge)) and m.name == name
             and all(m.labels.get(k) == v for k, v in labels.items())]
    return sum(m.value for m in found)


def test_generate_is_counted_as_the_server_counts_it(llm):
    before = llm.get_metrics()
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outputs = llm.generate(PROMPTS, params, use_tqdm=False)
    after = llm.get_metrics()
    prompt_tokens = sum(len(o.prompt_token_ids) for o in outputs)

    def grew(name: str, **labels: str) -> float:
        return _value(after, name, **labels) - _value(before, name, **labels)

    assert grew("vllm:prompt_tokens") == prompt_tokens
    assert grew("vllm:generation_tokens") == len(PROMPTS) * MAX_TOKENS
    assert grew("vllm:request_success", finished_reason="length") == len(PROMPTS)
    # the engine is idle again: nothing runs, nothing waits, no KV block is held
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
        assert _one(after, Gauge, name).value == 0

    ttft = _one(after, Histogram, "vllm:time_to_first_token_seconds")
    old_ttft = _one(before, Histogram, "vllm:time_to_first_token_seconds")
    assert ttft.count - old_ttft.count == len(PROMPTS) and ttft.buckets["+Inf"] == ttft.count
    bounds = list(ttft.buckets.values())
    assert bounds == sorted(bounds)  # cumulative, as exposed
    assert ttft.sum > old_ttft.sum
    assert ttft.labels == {"model_name": llm.config.model.model.rsplit("/", 1)[-1], "engine": "0"}

    def grew_count(name: str) -> int:
        return _one(after, Histogram, name).count - _one(before, Histogram, name).count

    assert grew_count("vllm:e2e_request_latency_seconds") == len(PROMPTS)
    assert grew_count("vllm:request_queue_time_seconds") == len(PROMPTS)
    assert grew_count("vllm:inter_token_latency_seconds") == len(PROMPTS) * (MAX_TOKENS - 1)
    prompt_hist = _one(after, Histogram, "vllm:request_prompt_tokens")
    assert prompt_hist.sum - _one(before, Histogram, "vllm:request_prompt_tokens").sum == prompt_tokens
    # vLLM's iteration tokens: each request adds its prompt once and its generated tokens
    iteration = _one(after, Histogram, "vllm:iteration_tokens_total")
    assert iteration.sum - _one(before, Histogram, "vllm:iteration_tokens_total").sum == \
        prompt_tokens + len(PROMPTS) * MAX_TOKENS


def test_chat_and_repeated_prompts_count_too(llm):
    before = llm.get_metrics()
    params = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    message = [{"role": "user", "content": "The quick brown fox jumps over the lazy dog. " * 4}]  # > 2 KV blocks
    llm.chat(message, params, use_tqdm=False)
    llm.chat(message, params, use_tqdm=False)
    after = llm.get_metrics()
    assert _value(after, "vllm:request_success") - _value(before, "vllm:request_success") == 2
    # the second chat's prompt came from the prefix cache (its full blocks, at least)
    assert _value(after, "vllm:prefix_cache_hits") > _value(before, "vllm:prefix_cache_hits")


def test_vllm_metrics_example(llm, capsys):
    """vLLM's examples/offline_inference/metrics.py, with its imports changed: the same calls."""
    prompts = ["Hello, my name is", "The president of the United States is", "The capital of France is",
               "The future of AI is"]
    sampling_params = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=8)
    outputs = llm.generate(prompts, sampling_params)
    for output in outputs:
        print(f"Prompt: {output.prompt!r}, Generated text: {output.outputs[0].text!r}")

    for metric in llm.get_metrics():
        if isinstance(metric, Gauge):
            print(f"{metric.name} (gauge) = {metric.value}")
        elif isinstance(metric, Counter):
            print(f"{metric.name} (counter) = {metric.value}")
        elif isinstance(metric, Vector):
            print(f"{metric.name} (vector) = {metric.values}")
        elif isinstance(metric, Histogram):
            print(f"{metric.name} (histogram)")
            print(f"    sum = {metric.sum}")
            print(f"    count = {metric.count}")
            for bucket_le, value in metric.buckets.items():
                print(f"    {bucket_le} = {value}")

    lines = capsys.readouterr().out.splitlines()
    total = next(m.value for m in llm.get_metrics() if m.name == "vllm:generation_tokens")
    assert f"vllm:generation_tokens (counter) = {total}" in lines
    assert "vllm:num_requests_running (gauge) = 0.0" in lines
    at = lines.index("vllm:time_to_first_token_seconds (histogram)")
    assert lines[at + 1].startswith("    sum = ") and lines[at + 2].startswith("    count = ")
    count = int(lines[at + 2].split("= ")[1])
    assert f"    +Inf = {count}" in lines[at + 3:]


def test_reader_digests_histograms_and_the_per_position_vector():
    """Labelled series come apart into one record each; the per-position counter is one Vector."""
    registry = CollectorRegistry()
    per_pos = PromCounter("vllm:spec_decode_num_accepted_tokens_per_pos", "", ["engine", "position"],
                          registry=registry)
    per_pos.labels("0", "0").inc(7)
    per_pos.labels("0", "2").inc(1)  # position 1 never accepted: it reads 0
    per_pos.labels("1", "0").inc(3)
    latency = PromHistogram("vllm:e2e_request_latency_seconds", "", ["engine"], buckets=(0.5, 1.0),
                            registry=registry)
    for value in (0.2, 0.7, 3.0):
        latency.labels("0").observe(value)
    PromCounter("aioinfer:requests_failed", "", registry=registry).inc()  # not a vllm: family: left out

    metrics = read_metrics(registry)
    assert {m.name for m in metrics} == {"vllm:spec_decode_num_accepted_tokens_per_pos",
                                         "vllm:e2e_request_latency_seconds"}
    vectors = {m.labels["engine"]: m.values for m in metrics if isinstance(m, Vector)}
    assert vectors == {"0": [7, 0, 1], "1": [3]}
    (histogram,) = [m for m in metrics if isinstance(m, Histogram)]
    assert histogram.labels == {"engine": "0"}
    assert histogram.buckets == {"0.5": 1, "1.0": 2, "+Inf": 3}
    assert histogram.count == 3 and histogram.sum == pytest.approx(3.9)
