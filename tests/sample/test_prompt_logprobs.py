"""Prompt logprobs (SamplingParams.prompt_logprobs) equal transformers' in float32, on every path that
computes a prompt: chunked prefill, a batch where others decode, prefix caching, preemption by
recompute, async scheduling; and -1 (the whole vocabulary) for prompt and sampled logprobs."""

from __future__ import annotations

import random

import pytest
import torch

from aioinfer import LLM, SamplingParams
from aioinfer.engine.output_processor import OutputProcessor
from aioinfer.sample.prompt_logprobs import rows_per_slice
from tiny_models import VOCAB_SIZE, make_tiny_model_dir

TOLERANCE = 1e-4
_rng = random.Random(7)
LONG = [_rng.randrange(VOCAB_SIZE) for _ in range(70)]  # several chunks of a 16-token budget
SHORT = [5, 9, 13, 200, 7]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model_dir(tmp_path_factory.mktemp("qwen2-prompt-logprobs"), arch="qwen2")


@pytest.fixture(scope="module")
def hf(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def hf_logprobs(hf, prompt: list[int]) -> torch.Tensor:
    """[len(prompt), V]: row j is the distribution of token j + 1 given tokens 0..j."""
    with torch.no_grad():
        return hf(torch.tensor([prompt])).logits[0].float().log_softmax(-1)


def assert_prompt_logprobs_match(entries, prompt: list[int], reference: torch.Tensor, num_top: int) -> None:
    """vLLM's shape (None, then per token its own entry and the top-N) with transformers' values."""
    assert len(entries) == len(prompt) and entries[0] is None
    for j in range(1, len(prompt)):
        entry, row, token = entries[j], reference[j - 1], prompt[j]
        assert entry[token].logprob == pytest.approx(row[token].item(), abs=TOLERANCE), f"position {j}"
        # Its rank: 1 + the tokens more likely, up to the ones within rounding of it (near-ties).
        lowest, highest = (int((row > row[token] + d).sum()) + 1 for d in (TOLERANCE, -TOLERANCE))
        assert lowest <= entry[token].rank <= highest, f"position {j}"
        top = row.topk(num_top).indices.tolist()
        assert set(entry) == set(top) | {token}, f"position {j}"
        assert max(abs(entry[t].logprob - row[t].item()) for t in entry) < TOLERANCE, f"position {j}"
        if num_top <= 20:  # the whole vocabulary has near-ties whose order rounding may swap
            assert [entry[t].rank for t in top if t != token] == [r + 1 for r, t in enumerate(top) if t != token]


def _llm(model_dir, **options) -> LLM:
    return LLM(model=str(model_dir), dtype="float32", device="cpu", **options)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_chunked_prompt_beside_decoding_requests_matches_transformers(model_dir, hf, async_scheduling):
    # A 16-token budget: the long prompt takes 5 chunks while the short requests decode beside it.
    llm = _llm(model_dir, max_num_batched_tokens=16, block_size=4, async_scheduling=async_scheduling)
    grants = []  # per step: request id -> (first position, tokens) granted
    schedule = llm.engine.scheduler.schedule

    def recording_schedule():
        out = schedule()
        grants.append({s.request_id: (s.start_position, len(s.token_ids)) for s in out.scheduled})
        return out

    llm.engine.scheduler.schedule = recording_schedule
    decoding = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    scored = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True, prompt_logprobs=5)
    outs = llm.generate([SHORT, LONG, [42] * 3], [decoding, scored, decoding], use_tqdm=False)
    assert_prompt_logprobs_match(outs[1].prompt_logprobs, LONG, hf_logprobs(hf, LONG), 5)
    assert outs[0].prompt_logprobs is None and outs[2].prompt_logprobs is None
    # Chunks of the long prompt (request "1") ran in the same steps as decode steps of the first request.
    assert sum(1 for g in grants if g.get("1", (0, 0))[1] > 1 and g.get("0", (0, 0))[1] == 1) >= 3
    alone = llm.generate([SHORT, [42] * 3], decoding, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in alone] == [outs[0].outputs[0].token_ids, outs[2].outputs[0].token_ids]


def test_zero_keeps_only_the_prompt_token_and_one_token_prompts_have_no_rows(model_dir, hf):
    llm = _llm(model_dir)
    outs = llm.generate([LONG[:9], [17]], SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=0),
                        use_tqdm=False)
    entries = outs[0].prompt_logprobs
    assert_prompt_logprobs_match(entries, LONG[:9], hf_logprobs(hf, LONG[:9]), 0)
    assert all(len(entry) == 1 for entry in entries[1:])
    assert outs[1].prompt_logprobs == [None]
    assert all(entry[t].decoded_token == llm.get_tokenizer().decode([t]) for entry, t in zip(entries[1:], LONG[1:9]))


def test_prefix_cache_is_not_used_until_the_prompt_is_scored(model_dir, hf):
    llm = _llm(model_dir, block_size=4, enable_prefix_caching=True)
    plain = SamplingParams(temperature=0, max_tokens=2)
    assert llm.generate([LONG], plain, use_tqdm=False)[0].num_cached_tokens == 0
    assert llm.generate([LONG], plain, use_tqdm=False)[0].num_cached_tokens > 0  # the cache holds it
    scored = llm.generate([LONG], SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=2), use_tqdm=False)[0]
    assert scored.num_cached_tokens == 0
    assert_prompt_logprobs_match(scored.prompt_logprobs, LONG, hf_logprobs(hf, LONG), 2)


def test_preempted_mid_prefill_keeps_its_rows_and_computes_none_twice(model_dir, hf):
    """One sequence slot: an urgent request (better priority) preempts the scoring one after two of its
    chunks; it is recomputed from position 0 and its rows still come out once each, in order."""
    llm = _llm(model_dir, max_num_seqs=1, max_num_batched_tokens=16, block_size=4)
    core, processor = llm.engine, OutputProcessor(llm.get_tokenizer())

    def add(request_id, prompt, params, priority):
        request = llm.inputs.make_request(request_id, prompt, params, priority=priority)
        core.add_request(request)
        processor.add_request(request_id, None, prompt, params)
        return request

    scored = add("scored", LONG, SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=3), priority=1)
    deltas = []
    for _ in range(2):
        deltas += processor.process(core.step())[0]
    assert scored.num_computed_tokens == 32 and not deltas
    add("urgent", SHORT, SamplingParams(temperature=0, max_tokens=3), priority=0)
    while core.has_unfinished():
        deltas += processor.process(core.step())[0]
    assert scored.num_preemptions == 1
    first = [d for d in deltas if d.request_id == "scored" and d.prompt_logprobs is not None]
    assert len(first) == 1
    assert_prompt_logprobs_match(first[0].prompt_logprobs, LONG, hf_logprobs(hf, LONG), 3)
    assert core.kv_cache.all_free()


def test_slices_bound_the_logits_of_a_chunk(model_dir, hf, monkeypatch):
    """A chunk scored in slices of a few rows (as a large vocabulary would make them) is the same."""
    from aioinfer.sample import prompt_logprobs

    monkeypatch.setattr(prompt_logprobs, "SLICE_BYTES", 3 * 8 * VOCAB_SIZE)  # 2 rows of 4 top entries a slice
    limit = rows_per_slice(VOCAB_SIZE, 4)
    assert limit == 2
    llm = _llm(model_dir, max_num_batched_tokens=32)
    model = llm.engine.executor.runner.model
    rows_seen = []
    compute_logits = model.compute_logits

    def recording(hidden, out=None):
        rows_seen.append(hidden.shape[0])
        return compute_logits(hidden, out)

    model.compute_logits = recording
    out = llm.generate([LONG], SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=4), use_tqdm=False)[0]
    assert_prompt_logprobs_match(out.prompt_logprobs, LONG, hf_logprobs(hf, LONG), 4)
    # 69 positions scored in 3 chunks, never more than a slice's rows of logits at once (+ the sampled row).
    assert max(rows_seen) == limit and sum(rows_seen) == len(LONG) - 1 + 1


def test_whole_vocabulary(model_dir, hf):
    llm = _llm(model_dir, max_logprobs=-1)  # vLLM's rule: -1 needs the engine's cap lifted
    prompt = LONG[:6]
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=-1, logprobs=-1),
                       use_tqdm=False)[0]
    assert_prompt_logprobs_match(out.prompt_logprobs, prompt, hf_logprobs(hf, prompt), VOCAB_SIZE)
    assert all(len(entry) == VOCAB_SIZE for entry in out.prompt_logprobs[1:])
    assert [len(entry) for entry in out.outputs[0].logprobs] == [VOCAB_SIZE] * 2
    reference = hf_logprobs(hf, prompt + out.outputs[0].token_ids[:1])
    entry = out.outputs[0].logprobs[1]
    assert sorted(lp.rank for lp in entry.values()) == list(range(1, VOCAB_SIZE + 1))
    assert max(abs(lp.logprob - reference[-1, t].item()) for t, lp in entry.items()) < TOLERANCE


def test_whole_vocabulary_is_bounded(model_dir):
    from aioinfer.sampling_params import MAX_WHOLE_VOCAB_ENTRIES

    llm = _llm(model_dir, max_logprobs=-1)
    limit = MAX_WHOLE_VOCAB_ENTRIES // VOCAB_SIZE
    with pytest.raises(ValueError, match="needs max_tokens"):
        llm.generate([SHORT], SamplingParams(logprobs=-1, max_tokens=limit + 1), use_tqdm=False)
    with pytest.raises(ValueError, match="needs max_tokens"):
        llm.generate([SHORT], SamplingParams(logprobs=-1, max_tokens=None), use_tqdm=False)
    params = SamplingParams(prompt_logprobs=-1)
    params.validate_for_prompt(limit, VOCAB_SIZE)
    with pytest.raises(ValueError, match="prompts of at most"):
        params.validate_for_prompt(limit + 1, VOCAB_SIZE)
    with pytest.raises(ValueError, match="prompts of at most"):  # offline too, at admission
        llm.generate([[1] * (limit + 1)], params, use_tqdm=False)
    with pytest.raises(ValueError, match="prompt_logprobs"):
        SamplingParams(prompt_logprobs=-2)


def test_the_engine_caps_logprobs_at_max_logprobs(model_dir):
    """vLLM's max_logprobs: 20 unless set; -1 counts as the vocabulary and needs the cap at -1 (or at
    least the vocabulary); a raised cap gives that many entries a position."""
    from aioinfer.sampling_params import LogprobsCapExceeded

    default = _llm(model_dir)
    for params in (SamplingParams(max_tokens=1, logprobs=21), SamplingParams(max_tokens=1, prompt_logprobs=21),
                   SamplingParams(max_tokens=1, logprobs=-1), SamplingParams(max_tokens=1, prompt_logprobs=-1)):
        with pytest.raises(LogprobsCapExceeded, match="max_logprobs, 20"):
            default.generate([SHORT], params, use_tqdm=False)
    raised = _llm(model_dir, max_logprobs=30)
    out = raised.generate([SHORT], SamplingParams(temperature=0, max_tokens=2, logprobs=30, prompt_logprobs=25),
                          use_tqdm=False)[0]
    assert [len(entry) >= 30 for entry in out.outputs[0].logprobs] == [True, True]
    assert all(len(entry) >= 25 for entry in out.prompt_logprobs[1:])
    with pytest.raises(LogprobsCapExceeded, match="max_logprobs, 30"):
        raised.generate([SHORT], SamplingParams(max_tokens=1, logprobs=-1), use_tqdm=False)
    with pytest.raises(ValueError, match="max_logprobs"):
        _llm(model_dir, max_logprobs=-2)


def test_tensor_parallel_ranks_score_the_same_slices(tmp_path_factory):
    """TP=2 over gloo: every rank runs the LM head's gathers for the same slices; an odd vocabulary
    (padding on the last rank) and an untied head."""
    from transformers import AutoModelForCausalLM

    path = make_tiny_model_dir(tmp_path_factory.mktemp("llama"), arch="llama", vocab_size=509)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prompt = [token % 509 for token in LONG]
    with LLM(model=str(path), dtype="float32", device="cpu", tensor_parallel_size=2,
             max_num_batched_tokens=16) as llm:
        outs = llm.generate([SHORT, prompt], [SamplingParams(temperature=0, max_tokens=6),
                                              SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=3)],
                            use_tqdm=False)
    assert_prompt_logprobs_match(outs[1].prompt_logprobs, prompt, hf_logprobs(hf, prompt), 3)


@pytest.mark.gpu
def test_cuda_with_graphs_and_async_scheduling_matches_transformers(model_dir, hf):
    """The device path: pinned copies and their event, token-bucket CUDA graphs (16-token steps mixing
    decode and prefill), async scheduling; a whole-vocabulary request beside the others."""
    llm = LLM(model=str(model_dir), dtype="float32", device="cuda", max_num_batched_tokens=16, block_size=16,
              num_kv_blocks=256, max_logprobs=-1)
    assert llm.engine.async_scheduling and llm.engine.executor.runner.graphs is not None
    decoding = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    scored = SamplingParams(temperature=0, max_tokens=3, prompt_logprobs=5)
    whole = SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=-1, logprobs=-1)
    outs = llm.generate([SHORT, LONG, LONG[:7]], [decoding, scored, whole], use_tqdm=False)
    assert_prompt_logprobs_match(outs[1].prompt_logprobs, LONG, hf_logprobs(hf, LONG), 5)
    assert_prompt_logprobs_match(outs[2].prompt_logprobs, LONG[:7], hf_logprobs(hf, LONG[:7]), VOCAB_SIZE)
    assert [len(entry) for entry in outs[2].outputs[0].logprobs] == [VOCAB_SIZE] * 2
