"""Structured outputs in the engine (llguidance): every output matches its schema, regex, choice or
grammar, and a constrained request's tokens are the same on every scheduler path and alone as in a batch.

Real models only (SmolLM2 and Qwen2.5-Coder GGUFs): a grammar needs the model's tokenizer.
"""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import torch

from aioinfer import LLM, SamplingParams
from aioinfer.structured_output import InvalidGrammarError, StructuredOutputsParams
from aioinfer.structured_output.compiler import GrammarCompiler
from aioinfer.structured_output.grammar_mask import GrammarMasks
from aioinfer.sample.sampling_metadata import SamplingRow
from json_schemas import schemas

PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "city"],
          "properties": {"name": {"type": "string", "pattern": "^[A-Z][a-z]{2,8}$"},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "city": {"type": "string", "maxLength": 20}}}
TEXT = "Alice Smith is 34 years old and lives in Paris. Bob Jones is 51 and lives in Rome. "
WORDS = r"[A-Za-z ]{1,60}\."  # no digits: n-gram drafts copying "34" or "51" break it


def _chat(tokenizer, content: str) -> list[int]:
    text = tokenizer.apply_chat_template([{"role": "user", "content": content}], tokenize=False,
                                         add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)


def _llm(path, **kwargs) -> LLM:
    return LLM(model=str(path), dtype="float32", device="cpu", max_model_len=2048, **kwargs)


@pytest.fixture(scope="module")
def smollm2(smollm2_gguf):
    return _llm(smollm2_gguf)


# ----------------------------------------------------------------------------- params and compiler

def test_params_need_exactly_one_constraint():
    with pytest.raises(InvalidGrammarError, match="exactly one"):
        StructuredOutputsParams()
    with pytest.raises(InvalidGrammarError, match="json, regex"):
        StructuredOutputsParams(json={"type": "object"}, regex="a+")
    with pytest.raises(InvalidGrammarError, match="not valid JSON"):
        StructuredOutputsParams(json="{not json")
    with pytest.raises(InvalidGrammarError, match="choice"):
        StructuredOutputsParams(choice=[])
    assert StructuredOutputsParams(json='{"type": "integer"}').json == {"type": "integer"}
    params = SamplingParams(structured_outputs={"choice": ["a", "b"]})
    assert params.structured_outputs.choice == ["a", "b"]
    assert params.clone().structured_outputs.key == params.structured_outputs.key
    with pytest.raises(ValueError, match="structured_outputs"):
        SamplingParams(structured_outputs="a+")


def test_compile_errors_name_what_is_wrong(smollm2_tokenizer):
    compiler = GrammarCompiler(smollm2_tokenizer, 49152, [2])
    for params, message in [(StructuredOutputsParams(regex="a(b"), "invalid regex"),
                            (StructuredOutputsParams(json={"type": "foo"}), "invalid JSON schema"),
                            (StructuredOutputsParams(grammar="start: foo"), "invalid grammar")]:
        with pytest.raises(InvalidGrammarError, match=message):
            compiler.compile(params)


def test_each_request_gets_its_own_matcher(smollm2_tokenizer):
    compiler = GrammarCompiler(smollm2_tokenizer, 49152, [2])
    first, second = (compiler.compile(StructuredOutputsParams(json=PERSON)) for _ in range(2))
    ids = smollm2_tokenizer.encode('{"name": "Bob"', add_special_tokens=False)
    assert first.consume_tokens(ids)
    assert second.validate_tokens(ids) == len(ids)  # still at the start: matchers share no state
    assert not second.validate_tokens(smollm2_tokenizer.encode("hello", add_special_tokens=False))


def test_matchers_built_ahead_are_taken_first(smollm2_tokenizer):
    """The server builds a request's matchers in a worker thread (``prepare``); ``compile`` then hands
    those out, each once, before building more; an invalid grammar fails in ``prepare`` already."""
    compiler = GrammarCompiler(smollm2_tokenizer, 49152, [2])
    params = StructuredOutputsParams(json=PERSON)
    compiler.prepare(params, count=2)
    ready = list(compiler._cache[params.key].ready)
    assert len(ready) == 2 and ready[0] is not ready[1]
    taken = [compiler.compile(params) for _ in range(3)]
    assert taken[0] is ready[0] and taken[1] is ready[1] and all(m is not taken[2] for m in ready)
    assert not compiler._cache[params.key].ready
    with pytest.raises(InvalidGrammarError, match="invalid regex"):
        compiler.prepare(StructuredOutputsParams(regex="a(b"), count=2)


def test_masks_allow_exactly_the_grammar_tokens(smollm2_tokenizer):
    """fill + apply on three rows, the middle one unconstrained: -inf exactly where the matcher says no."""
    vocab = 49152
    compiler = GrammarCompiler(smollm2_tokenizer, vocab, [2])
    matchers = [compiler.compile(StructuredOutputsParams(choice=["yes", "no"])),
                compiler.compile(StructuredOutputsParams(regex=r"\d+"))]
    rows = [SamplingRow(SamplingParams(), [1], [], 0, (2,), grammar=matchers[0]),
            SamplingRow(SamplingParams(), [1], [], 0, (2,)),
            SamplingRow(SamplingParams(), [1], [], 0, (2,), grammar=matchers[1])]
    masks = GrammarMasks(vocab, torch.device("cpu"))
    logits = torch.randn(3, vocab)
    expected = logits.clone()
    out = masks.apply(logits.clone(), masks.fill(rows, None))
    for row, matcher in ((0, matchers[0]), (2, matchers[1])):
        allowed = [t for t in range(vocab) if matcher.validate_tokens([t]) == 1]
        assert torch.isfinite(out[row]).nonzero().flatten().tolist() == allowed
        assert torch.equal(out[row, allowed], expected[row, allowed])
    assert torch.equal(out[1], expected[1])
    digit = smollm2_tokenizer.encode("7", add_special_tokens=False)
    assert torch.isfinite(out[2, digit]).all() and not torch.isfinite(out[0, digit]).any()


# ----------------------------------------------------------------------------- outputs match

def test_fifty_generated_schemas_all_validate(smollm2):
    """Nested objects, arrays, enums, required fields, bounded numbers, patterned strings: every greedy
    output parses and validates; three of them run alone give the same tokens as in the batch."""
    tokenizer = smollm2.get_tokenizer()
    generated = schemas(50)
    prompts = [_chat(tokenizer, "Give one example JSON value for this schema: " + json.dumps(s)) for s in generated]
    params = [SamplingParams(temperature=0, max_tokens=256, structured_outputs=StructuredOutputsParams(json=s))
              for s in generated]
    outputs = smollm2.generate(prompts, params, use_tqdm=False)
    for schema, output in zip(generated, outputs):
        completion = output.outputs[0]
        assert completion.finish_reason == "stop", completion.text
        jsonschema.validate(json.loads(completion.text), schema)
    for i in (0, 17, 42):
        alone = smollm2.generate([prompts[i]], params[i], use_tqdm=False)[0].outputs[0]
        assert alone.token_ids == outputs[i].outputs[0].token_ids


def test_regex_choice_and_grammar_outputs_match_when_sampled(smollm2):
    tokenizer = smollm2.get_tokenizer()
    prompt = _chat(tokenizer, "Name a colour and a number.")
    cases = [(StructuredOutputsParams(regex=r"[A-Z][a-z]{2,8} \d{2}"),
              lambda s: re.fullmatch(r"[A-Z][a-z]{2,8} \d{2}", s)),
             (StructuredOutputsParams(choice=["red", "green", "blue sky"]), lambda s: s in ("red", "green", "blue sky")),
             (StructuredOutputsParams(grammar='start: "colour: " COLOUR ("," " " COLOUR)*\nCOLOUR: "red" | "green"'),
              lambda s: re.fullmatch(r"colour: (red|green)(, (red|green))*", s)),
             (StructuredOutputsParams(json_object=True), lambda s: isinstance(json.loads(s), dict))]
    for constraint, matches in cases:
        params = SamplingParams(n=4, temperature=1.0, seed=3, max_tokens=48, structured_outputs=constraint)
        output = smollm2.generate([prompt], params, use_tqdm=False)[0]
        for completion in output.outputs:
            if constraint.kind != "json_object" or completion.finish_reason == "stop":
                assert matches(completion.text), (constraint.kind, completion.text)


@pytest.mark.parametrize("path_name", ["lockstep", "async", "speculation"])
def test_a_complete_grammar_keeps_taking_eos_when_eos_is_ignored(smollm2_gguf, path_name):
    """With ``ignore_eos`` a request runs on after its grammar is complete: the matcher, stopped, is
    given every EOS sampled under its EOS-only mask (no row is left out of the batch's advance) and
    accepts each one; a free request beside it is unaffected. With speculation the n-gram drafts
    after the answer are EOS, and every row after them allows EOS only too (llguidance writes no row
    past a complete grammar's: those rows allowed every token, and the token after the accepted
    drafts was anything)."""
    options = {"lockstep": {}, "async": {"async_scheduling": True},
               "speculation": {"speculative_config": {"method": "ngram", "num_speculative_tokens": 4,
                                                      "prompt_lookup_min": 1, "prompt_lookup_max": 3}}}
    llm = _llm(smollm2_gguf, **options[path_name])
    masks = llm.engine.executor.runner.grammar_masks
    params = [SamplingParams(temperature=0, max_tokens=12, ignore_eos=True,
                             structured_outputs=StructuredOutputsParams(choice=["yes", "no"])),
              SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)]
    outputs = llm.generate(["Answer: is the sky blue?", "Count to ten:"], params, use_tqdm=False)
    constrained = outputs[0].outputs[0]
    eos = set(llm.inputs.eos_token_ids)
    answer = [t for t in constrained.token_ids if t not in eos]
    assert llm.get_tokenizer().decode(answer) in ("yes", "no")
    tail = constrained.token_ids[len(answer):]
    assert len(constrained.token_ids) == 12 and len(tail) >= 8 and set(tail) <= eos
    assert masks.num_rejected == 0
    assert len(outputs[1].outputs[0].token_ids) == 12
    if path_name == "speculation":
        assert outputs[0].metrics["num_accepted_tokens"] > 0
    llm.shutdown()


def test_min_tokens_gives_way_to_a_grammar_that_needs_a_stop_token(smollm2):
    """min_tokens masks EOS and the stop tokens until it is reached; a grammar that is complete early
    allows EOS only. The row keeps EOS then (the grammar wins: all its logits -inf, it drew a token
    the grammar rejected), and that early EOS does not end the request: it ends at the first EOS
    from min_tokens on, and its text is the answer."""
    tokenizer = smollm2.get_tokenizer()
    masks = smollm2.engine.executor.runner.grammar_masks
    rejected = masks.num_rejected
    eos = set(smollm2.inputs.eos_token_ids)
    for options in ({"temperature": 0}, {"temperature": 1.0, "seed": 5, "top_k": 20}):
        params = SamplingParams(max_tokens=24, min_tokens=8, **options,
                                structured_outputs=StructuredOutputsParams(choice=["yes", "no"]))
        output = smollm2.generate([_chat(tokenizer, "Is the sky blue?")], params, use_tqdm=False)[0].outputs[0]
        assert output.text in ("yes", "no") and output.finish_reason == "stop"
        answer = [t for t in output.token_ids if t not in eos]
        assert len(output.token_ids) == 9 and set(output.token_ids[len(answer):]) <= eos
    assert masks.num_rejected == rejected


def test_invalid_constraint_raises_and_queues_nothing(smollm2):
    params = SamplingParams(structured_outputs=StructuredOutputsParams(json={"type": "object", "minProperties": "x"}))
    with pytest.raises(InvalidGrammarError, match="JSON schema"):
        smollm2.generate(["hello", "world"], [SamplingParams(), params], use_tqdm=False)
    assert not smollm2.engine.has_unfinished()


# ----------------------------------------------------------------------------- every scheduler path

SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
PATHS = {
    "chunked prefill": {"max_num_batched_tokens": 32},
    "preemption by recompute": {"num_kv_blocks": 48, "block_size": 4},
    "preemption by swap": {"num_kv_blocks": 48, "block_size": 4, "preemption_mode": "swap", "swap_space_gib": 0.05},
    "async scheduling": {"async_scheduling": True},
    "speculation": {"speculative_config": SPEC},
    "speculation, async, preempting": {"speculative_config": SPEC, "async_scheduling": True, "num_kv_blocks": 48,
                                       "block_size": 4},
}


@pytest.fixture(scope="module")
def mixed_batch(smollm2):
    """Constrained and free requests side by side (one with a penalty); greedy outputs of the default path."""
    tokenizer = smollm2.get_tokenizer()
    copy = _chat(tokenizer, TEXT * 2 + "Repeat the first sentence.")
    requests = [(copy, StructuredOutputsParams(regex=WORDS), {}),
                (copy, None, {}),
                (_chat(tokenizer, TEXT + "Give Alice as JSON."), StructuredOutputsParams(json=PERSON), {}),
                (_chat(tokenizer, TEXT + "Who is older?"), StructuredOutputsParams(choice=["Alice", "Bob"]), {}),
                (_chat(tokenizer, TEXT + "Give Bob as JSON."), StructuredOutputsParams(json=PERSON),
                 {"repetition_penalty": 1.2}),
                (_chat(tokenizer, "Write a haiku."), None, {"repetition_penalty": 1.2})]
    prompts = [r[0] for r in requests]
    params = [SamplingParams(temperature=0, max_tokens=40, structured_outputs=so, **extra) for _, so, extra in requests]
    reference = [o.outputs[0].token_ids for o in smollm2.generate(prompts, params, use_tqdm=False)]
    assert re.fullmatch(WORDS, tokenizer.decode(reference[0], skip_special_tokens=True))
    return prompts, params, reference


@pytest.mark.parametrize("path_name", list(PATHS))
def test_constrained_tokens_identical_on_every_path(smollm2_gguf, mixed_batch, path_name):
    prompts, params, reference = mixed_batch
    llm = _llm(smollm2_gguf, **PATHS[path_name])
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == reference
    if "preemption" in path_name:
        assert llm.engine.scheduler.num_preemptions > 0
    if "speculation" in path_name:
        # The regex request drafted: most drafts of its copied sentence were accepted, and the
        # grammar rejected the drafts that would copy the digits.
        metrics = outputs[0].metrics
        assert 0 < metrics["num_accepted_tokens"] < metrics["num_draft_tokens"]


ASYNC_PATHS = {
    "async": {},
    "async, chunked prefill": {"max_num_batched_tokens": 32},
    "async, preemption by recompute": {"num_kv_blocks": 36, "block_size": 4},
    "async, preemption by swap": {"num_kv_blocks": 36, "block_size": 4, "preemption_mode": "swap",
                                  "swap_space_gib": 0.05},
    "async, speculation": {"speculative_config": SPEC},
}


@pytest.mark.parametrize("path_name", list(ASYNC_PATHS))
def test_grammar_steps_scheduled_ahead_give_the_same_tokens(smollm2, smollm2_gguf, mixed_batch, path_name):
    """Without penalties in the batch, async scheduling launches each step before the previous step's
    tokens are known and samples it once they are (its masks filled in a worker thread): the same
    tokens as in lockstep."""
    prompts, params, _ = mixed_batch
    keep = [i for i, p in enumerate(params) if p.repetition_penalty == 1.0]
    prompts, params = [prompts[i] for i in keep], [params[i] for i in keep]
    reference = [o.outputs[0].token_ids for o in smollm2.generate(prompts, params, use_tqdm=False)]
    llm = _llm(smollm2_gguf, async_scheduling=True, **ASYNC_PATHS[path_name])
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == reference
    assert llm.engine.executor.runner.num_deferred_steps > 0
    if "preemption" in path_name:
        assert llm.engine.scheduler.num_preemptions > 0
    if "speculation" in path_name:  # steps with drafts (in lockstep) between steps ahead
        assert outputs[0].metrics["num_accepted_tokens"] > 0
    assert llm.engine.kv_cache.all_free()


@pytest.mark.parametrize("masks", ["ready at every poll", "never ready at a poll"])
def test_a_step_ahead_is_sampled_when_its_masks_are_ready_or_before_the_next_launch(smollm2, smollm2_gguf,
                                                                                   mixed_batch, masks):
    """The engine samples a deferred step as soon as a poll finds its masks computed (at the end of
    the step that started them, or after the next schedule), else just before the next launch: both
    orders give the lockstep tokens. The worker's timing is taken out of the test: the poll waits for
    the masks (every step ahead sampled at the end of the call that started them) or says they are
    never ready (every one sampled before the next launch)."""
    prompts, params, _ = mixed_batch
    keep = [i for i, p in enumerate(params) if p.repetition_penalty == 1.0]
    prompts, params = [prompts[i] for i in keep], [params[i] for i in keep]
    reference = [o.outputs[0].token_ids for o in smollm2.generate(prompts, params, use_tqdm=False)]
    llm = _llm(smollm2_gguf, async_scheduling=True)
    core, runner = llm.engine, llm.engine.executor.runner
    real_poll, real_finish = runner.poll_masks, runner.finish
    ready = masks == "ready at every poll"
    sampled_at_the_end = []  # per deferred step sampled: whether the call that launched it sampled it

    def poll_masks(launched):
        pending = launched.pending_mask
        if ready and launched.logits is not None and pending is not None and pending.job is not None:
            pending.job.wait()
        return real_poll(launched) and ready

    def finish(launched):
        if launched.logits is not None:
            sampled_at_the_end.append(core._in_flight is not None and core._in_flight[1] is launched)
        real_finish(launched)

    runner.poll_masks, runner.finish = poll_masks, finish
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == reference
    assert runner.num_deferred_steps > 0 and len(sampled_at_the_end) == runner.num_deferred_steps
    if ready:
        assert all(sampled_at_the_end)
    else:
        assert not any(sampled_at_the_end)
    assert core.kv_cache.all_free()


@pytest.mark.slow
def test_qwen25_schemas_validate(qwen25_coder_gguf):
    llm = _llm(qwen25_coder_gguf, max_num_batched_tokens=2048)
    tokenizer = llm.get_tokenizer()
    generated = schemas(8, seed=5)
    prompts = [_chat(tokenizer, "Give one example JSON value for this schema: " + json.dumps(s)) for s in generated]
    params = [SamplingParams(temperature=0, max_tokens=200, structured_outputs=StructuredOutputsParams(json=s))
              for s in generated]
    for schema, output in zip(generated, llm.generate(prompts, params, use_tqdm=False)):
        assert output.outputs[0].finish_reason == "stop", output.outputs[0].text
        jsonschema.validate(json.loads(output.outputs[0].text), schema)


def test_offline_chat_shows_the_tools(smollm2):
    """SmolLM2's template ignores ``tools``: LLM.chat puts them in a system message (the server's rule),
    and a call constrained to the function's schema validates."""
    from aioinfer.entrypoints.chat_tools import render_with_tools

    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": PERSON}}]
    messages = [{"role": "user", "content": "Weather for Alice?"}]
    prompt = render_with_tools(smollm2.get_tokenizer(), messages, tools, add_generation_prompt=True)
    assert "<tools>" in prompt and '"get_weather"' in prompt
    params = SamplingParams(temperature=0, max_tokens=60, structured_outputs=StructuredOutputsParams(json=PERSON))
    output = smollm2.chat(messages, params, use_tqdm=False, tools=tools)[0]
    assert output.prompt == prompt
    jsonschema.validate(json.loads(output.outputs[0].text), PERSON)


def test_async_engine_streams_constrained_requests_scheduled_ahead(smollm2, smollm2_gguf, mixed_batch):
    """The asyncio ``Engine`` with async scheduling: constrained streams give the lockstep tokens, a
    constrained stream closed early takes its request (and matcher) with it, and every block is free."""
    import anyio

    from aioinfer import Engine

    prompts, params, _ = mixed_batch
    keep = [i for i, p in enumerate(params) if p.repetition_penalty == 1.0]
    prompts, params = [prompts[i] for i in keep], [params[i] for i in keep]
    reference = [o.outputs[0].token_ids for o in smollm2.generate(prompts, params, use_tqdm=False)]
    closed_after = 3

    async def main():
        async with Engine(str(smollm2_gguf), dtype="float32", device="cpu", max_model_len=2048,
                          async_scheduling=True) as engine:
            got = [[] for _ in prompts]

            async def one(i, limit=None):
                async for delta in engine.generate(prompts[i], params[i]):
                    got[i] += delta.token_ids
                    if limit is not None and len(got[i]) >= limit:
                        break

            async with anyio.create_task_group() as tg:
                for i in range(len(prompts)):
                    tg.start_soon(one, i, closed_after if i == 2 else None)
            await anyio.sleep(0)
            core = engine._core  # read after the streams: the GPU thread is idle
            return got, core

    got, core = anyio.run(main)
    assert [g for i, g in enumerate(got) if i != 2] == [r for i, r in enumerate(reference) if i != 2]
    assert got[2] == reference[2][:len(got[2])] and len(got[2]) >= closed_after
    assert core.executor.runner.num_deferred_steps > 0
    assert core.kv_cache.all_free() and not core.scheduler.has_unfinished()


def test_bitmask_apply_forms_agree():
    """The torch form (CUDA without Triton) sets exactly the logits the NumPy reference does, every row
    or a subset, the last word's spare bits ignored."""
    from aioinfer.structured_output.bitmask_apply import apply_bitmask_reference, apply_bitmask_torch

    generator = torch.Generator().manual_seed(0)
    vocab = 32 * 7 + 5
    bits = torch.randint(-2**31, 2**31 - 1, (3, 8), dtype=torch.int32, generator=generator)
    logits = torch.randn(5, vocab, generator=generator)
    for rows in (None, torch.tensor([4, 0, 2])):
        subset = logits[:3] if rows is None else logits
        expected = apply_bitmask_reference(subset.clone(), bits, rows)
        assert torch.equal(apply_bitmask_torch(subset.clone(), bits, rows), expected)
        masked = torch.isinf(expected[:3] if rows is None else expected[rows])
        word = bits[0, 0].item() & 0xFFFFFFFF
        assert masked[0, :32].tolist() == [not (word >> j) & 1 for j in range(32)]
    assert torch.isinf(expected).sum() > 0 and torch.isfinite(expected[1]).all()  # row 1 has no mask


# ----------------------------------------------------------------------------- structural tags

WEATHER_TAG = {"structures": [{"begin": "<function=get_weather>", "end": "</function>",
                               "schema": {"type": "object", "required": ["city"], "additionalProperties": False,
                                          "properties": {"city": {"type": "string", "maxLength": 30}}}}],
               "triggers": ["<function="]}


def test_structural_tag_specs_are_checked():
    assert StructuredOutputsParams(structural_tag=json.dumps(WEATHER_TAG)).structural_tag == WEATHER_TAG
    for spec, message in [({"structures": WEATHER_TAG["structures"]}, "triggers"),
                          ({"triggers": ["<f"], "structures": []}, "structures"),
                          ({"triggers": ["<tool>"], "structures": WEATHER_TAG["structures"]}, "none of the triggers"),
                          ({"triggers": ["<f"], "structures": [{"begin": "<f", "schema": "x"}]}, "schema"),
                          ({"type": "structural_tag", "format": {"type": "const_string"}}, "format"),
                          ("{not json", "not valid JSON")]:
        with pytest.raises(InvalidGrammarError, match=message):
            StructuredOutputsParams(structural_tag=spec)


def test_structural_tag_matcher_frees_text_and_constrains_the_tag(smollm2_tokenizer):
    compiler = GrammarCompiler(smollm2_tokenizer, 49152, [2])
    params = StructuredOutputsParams(structural_tag=WEATHER_TAG)
    good = smollm2_tokenizer.encode('Let me look. <function=get_weather>{"city": "Paris"}</function> Done.',
                                    add_special_tokens=False)
    assert compiler.compile(params).validate_tokens(good) == len(good)
    prefix = smollm2_tokenizer.encode("Let me look. <function=get_weather>", add_special_tokens=False)
    bad = smollm2_tokenizer.encode('Let me look. <function=get_weather>{"town": 3}', add_special_tokens=False)
    accepted = compiler.compile(params).validate_tokens(bad)
    assert len(prefix) <= accepted < len(bad)


def test_structural_tag_output_follows_the_tag_once_triggered(smollm2):
    """A trigger the model writes anyway (the first word of its unconstrained answer): the greedy
    output then has the same opening, the begin completed, JSON that validates, and the end."""
    tokenizer = smollm2.get_tokenizer()
    prompt = _chat(tokenizer, "What is the weather like in Paris today?")
    free = smollm2.generate([prompt], SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)[0].outputs[0].text
    trigger = free.split()[0]
    begin = trigger + " <weather>"
    tag = {"structures": [{"begin": begin, "end": "</weather>", "schema": WEATHER_TAG["structures"][0]["schema"]}],
           "triggers": [trigger]}
    out = smollm2.generate([prompt], SamplingParams(temperature=0, max_tokens=80, structured_outputs=
                                                    StructuredOutputsParams(structural_tag=tag)),
                           use_tqdm=False)[0].outputs[0].text
    at = out.index(begin)
    assert trigger not in out[:at]
    body, end, _rest = out[at + len(begin):].partition("</weather>")
    assert end, out
    jsonschema.validate(json.loads(body), tag["structures"][0]["schema"])
