"""Offline LLM features on a real (tiny, random) model path: seeds, n, stop rules, logprobs, chat, errors."""

from __future__ import annotations

import pytest
import torch

from aioinfer import LLM, SamplingParams
from tiny_models import make_tiny_model_dir

PROMPTS = [[5, 9, 13, 200, 7], [42] * 3, list(range(30, 70)), [311, 17], [99, 98, 97, 96, 95, 94, 93, 92, 91]]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model_dir(tmp_path_factory.mktemp("qwen2"), arch="qwen2")


@pytest.fixture(scope="module")
def llm(model_dir):
    return LLM(model=str(model_dir), dtype="float32", device="cpu", max_num_batched_tokens=64)


@pytest.fixture(scope="module")
def hf(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def tokens(outputs, index=0):
    return [o.outputs[index].token_ids for o in outputs]


def test_seeded_sampling_is_reproducible_and_batch_independent(llm, model_dir):
    target = SamplingParams(temperature=0.9, top_p=0.95, top_k=50, seed=1234, max_tokens=16, ignore_eos=True)
    alone = tokens(llm.generate([PROMPTS[0]], target, use_tqdm=False))[0]
    assert tokens(llm.generate([PROMPTS[0]], target, use_tqdm=False))[0] == alone
    others = [SamplingParams(temperature=0.0, max_tokens=10), SamplingParams(temperature=1.2, seed=7, max_tokens=20),
              SamplingParams(temperature=0.5, min_p=0.1, max_tokens=5), SamplingParams(temperature=1.0, max_tokens=12)]
    mixed = llm.generate(PROMPTS[1:] + [PROMPTS[0]], others + [target], use_tqdm=False)
    assert mixed[-1].outputs[0].token_ids == alone
    # ... and under preemption, with a different block size and token budget
    small = LLM(model=str(model_dir), dtype="float32", device="cpu", block_size=4, num_kv_blocks=20,
                max_num_batched_tokens=16)
    squeezed = small.generate(PROMPTS[1:] + [PROMPTS[0]], others + [target], use_tqdm=False)
    assert small.engine.scheduler.num_preemptions > 0
    assert squeezed[-1].outputs[0].token_ids == alone
    assert squeezed[1].outputs[0].token_ids == mixed[1].outputs[0].token_ids  # the other seeded one too
    different = tokens(llm.generate([PROMPTS[0]], target.__class__(temperature=0.9, top_p=0.95, top_k=50, seed=99,
                                                                   max_tokens=16, ignore_eos=True), use_tqdm=False))[0]
    assert different != alone


def test_n_samples(llm):
    params = SamplingParams(n=4, temperature=1.0, seed=3, max_tokens=8, ignore_eos=True)
    out = llm.generate([PROMPTS[2]], params, use_tqdm=False)[0]
    assert [c.index for c in out.outputs] == [0, 1, 2, 3]
    samples = [tuple(c.token_ids) for c in out.outputs]
    assert len(set(samples)) > 1 and all(len(s) == 8 for s in samples)
    again = llm.generate([PROMPTS[2]], params, use_tqdm=False)[0]
    assert [tuple(c.token_ids) for c in again.outputs] == samples


def test_greedy_logprobs_match_transformers(llm, hf):
    prompt = PROMPTS[2]
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=6, logprobs=3, ignore_eos=True),
                       use_tqdm=False)[0].outputs[0]
    full = torch.tensor([prompt + out.token_ids])
    with torch.no_grad():
        ref = torch.log_softmax(hf(full).logits[0].float(), dim=-1)
    assert len(out.logprobs) == 6
    cumulative = 0.0
    for i, (token, entry) in enumerate(zip(out.token_ids, out.logprobs)):
        row = ref[len(prompt) - 1 + i]
        assert entry[token].rank == 1
        assert entry[token].logprob == pytest.approx(row[token].item(), abs=1e-4)
        top = torch.topk(row, 3)
        assert [k for k, v in sorted(entry.items(), key=lambda kv: kv[1].rank)][:3] == top.indices.tolist()
        assert all(isinstance(v.decoded_token, str) for v in entry.values())
        cumulative += entry[token].logprob
    assert out.cumulative_logprob == pytest.approx(cumulative)


def test_eos_min_tokens_ignore_eos_and_stop_token_ids(llm):
    eos = llm.engine.loaded.eos_token_ids[0]
    force_eos = {eos: 100.0}
    out = llm.generate([PROMPTS[0]], SamplingParams(temperature=0, logit_bias=force_eos, max_tokens=10),
                       use_tqdm=False)[0].outputs[0]
    assert out.token_ids == [eos] and out.finish_reason == "stop" and out.stop_reason is None
    out = llm.generate([PROMPTS[0]], SamplingParams(temperature=0, logit_bias=force_eos, min_tokens=3, max_tokens=10),
                       use_tqdm=False)[0].outputs[0]
    assert len(out.token_ids) == 4 and eos not in out.token_ids[:3] and out.token_ids[3] == eos
    out = llm.generate([PROMPTS[0]], SamplingParams(temperature=0, logit_bias=force_eos, ignore_eos=True,
                                                    max_tokens=5), use_tqdm=False)[0].outputs[0]
    assert out.token_ids == [eos] * 5 and out.finish_reason == "length"
    greedy = llm.generate([PROMPTS[3]], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True),
                          use_tqdm=False)[0].outputs[0].token_ids
    stop_id = greedy[4]
    out = llm.generate([PROMPTS[3]], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True,
                                                    stop_token_ids=[stop_id]), use_tqdm=False)[0].outputs[0]
    assert out.token_ids == greedy[:greedy.index(stop_id) + 1] and out.stop_reason == stop_id


def test_stop_strings_on_decoded_text(llm):
    prompt = "Hello world"
    full = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True),
                        use_tqdm=False)[0].outputs[0]
    assert len(full.text) > 6, full.text
    stop = full.text[3:6]
    first = full.text.index(stop)
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, stop=[stop]),
                       use_tqdm=False)[0].outputs[0]
    assert out.text == full.text[:first] and out.finish_reason == "stop" and out.stop_reason == stop
    assert out.token_ids == full.token_ids[:len(out.token_ids)] and len(out.token_ids) < 24
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, stop=[stop],
                                                include_stop_str_in_output=True), use_tqdm=False)[0].outputs[0]
    assert out.text == full.text[:first + len(stop)]


def test_chat_uses_the_template(llm):
    messages = [{"role": "user", "content": "Hi there"}]
    out = llm.chat(messages, SamplingParams(temperature=0, max_tokens=5), use_tqdm=False)[0]
    tok = llm.get_tokenizer()
    expected_ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if hasattr(expected_ids, "keys"):  # transformers 5 returns a BatchEncoding
        expected_ids = expected_ids["input_ids"]
    assert out.prompt_token_ids == list(expected_ids)
    assert out.prompt.endswith("<|im_start|>assistant\n")


def test_default_sampling_params_come_from_generation_config(llm):
    defaults = llm.get_default_sampling_params()
    assert (defaults.temperature, defaults.top_p, defaults.top_k) == (0.7, 0.8, 20)


def test_max_tokens_none_runs_to_the_context_length(model_dir):
    small = LLM(model=str(model_dir), dtype="float32", device="cpu", max_model_len=24)
    out = small.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=None, ignore_eos=True),
                         use_tqdm=False)[0].outputs[0]
    assert len(out.token_ids) == 24 - len(PROMPTS[0]) and out.finish_reason == "length"


def test_bad_requests_raise_and_queue_nothing(llm):
    with pytest.raises(ValueError, match="maximum context length"):
        llm.generate([[1] * 10, [2] * 5000], SamplingParams(max_tokens=4), use_tqdm=False)
    with pytest.raises(ValueError, match="token ids must be in"):
        llm.generate([[1, 2, 10**6]], use_tqdm=False)
    with pytest.raises(ValueError, match="stop_token_ids"):
        llm.generate([[1, 2]], SamplingParams(stop_token_ids=[10**6]), use_tqdm=False)
    with pytest.raises(ValueError, match="prompts but"):
        llm.generate([[1], [2]], [SamplingParams()], use_tqdm=False)
    assert not llm.engine.has_unfinished() and llm.engine.kv_cache.all_free()
    # the engine still works afterwards
    assert len(llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2, ignore_eos=True),
                            use_tqdm=False)[0].outputs[0].token_ids) == 2


def test_dummy_weights_from_config_alone(model_dir, tmp_path):
    import shutil

    shutil.copy(model_dir / "config.json", tmp_path / "config.json")
    llm = LLM(model=str(tmp_path), load_format="dummy", dtype="float32", device="cpu")
    out = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=4, ignore_eos=True), use_tqdm=False)[0].outputs[0]
    assert len(out.token_ids) == 4 and out.text == ""  # no tokenizer: token ids only
    with pytest.raises(ValueError, match="no tokenizer"):
        llm.generate(["text"], use_tqdm=False)


def test_unreachable_hub_id_gives_a_clear_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="Hugging Face hub"):
        LLM(model="NoSuchOrg/no-such-model-xyz", device="cpu")
    with pytest.raises(FileNotFoundError, match="not found"):
        LLM(model="./no/such/folder", device="cpu")
