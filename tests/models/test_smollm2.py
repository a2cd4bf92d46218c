"""The real SmolLM2-135M-Instruct GGUF, loaded by our own loader, against transformers' load of the same file."""

from __future__ import annotations

import pytest
import torch

from aioinfer import LLM, SamplingParams
from aioinfer.engine.output_processor import OutputProcessor

pytestmark = pytest.mark.slow

MAX_TOKENS = 24
TEXT_PROMPTS = [
    "The capital of France is",
    "请用中文介绍一下北京。",
    "Emoji time 🎉🚀 and a haiku about the sea:",
]


@pytest.fixture(scope="module")
def llm(smollm2_gguf):
    return LLM(model=str(smollm2_gguf), dtype="float32", device="cpu")


@pytest.fixture(scope="module")
def hf(smollm2_gguf):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(smollm2_gguf.parent, gguf_file=smollm2_gguf.name,
                                                dtype=torch.float32).eval()


def _prompt_ids(llm) -> list[list[int]]:
    tok = llm.get_tokenizer()
    chat = tok.apply_chat_template([{"role": "user", "content": "What is 2 + 2? 用中文回答。"}],
                                   add_generation_prompt=True, tokenize=False)
    return [tok.encode(p) for p in TEXT_PROMPTS] + [tok.encode(chat, add_special_tokens=False)]


def test_greedy_tokens_equal_transformers(llm, hf):
    prompts = _prompt_ids(llm)
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=MAX_TOKENS), use_tqdm=False)
    tok = llm.get_tokenizer()
    for prompt, out in zip(prompts, outputs):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                              max_new_tokens=MAX_TOKENS, do_sample=False)[0, len(prompt):].tolist()
        got = out.outputs[0].token_ids
        assert got == ref, f"{tok.decode(prompt)!r}: {tok.decode(got)!r} != {tok.decode(ref)!r}"
        assert out.outputs[0].text == tok.decode(got, skip_special_tokens=True)
    assert llm.engine.kv_cache.all_free()


def test_chat_reply_stops_at_im_end(llm):
    out = llm.chat([{"role": "user", "content": "Say hello in one short sentence."}],
                   SamplingParams(temperature=0, max_tokens=64), use_tqdm=False)[0].outputs[0]
    assert out.finish_reason == "stop" and out.token_ids[-1] in llm.engine.loaded.eos_token_ids
    assert out.text.strip() and "<|im_end|>" not in out.text


def test_streamed_text_equals_full_text(llm):
    """Drive the core step by step as the async engine will, joining the text deltas."""
    tok = llm.get_tokenizer()
    prompts = _prompt_ids(llm) + [tok.encode("日本語のテキストと絵文字👨‍👩‍👧を書いてください：")]
    params = SamplingParams(temperature=0.8, seed=11, max_tokens=40)
    core, processor = llm.engine, OutputProcessor(tok)
    for i, ids in enumerate(prompts):
        core.add_request(llm.inputs.make_request(f"s{i}", ids, params.clone()))
        processor.add_request(f"s{i}", None, ids, params)
    pieces: dict[str, list[str]] = {}
    while core.has_unfinished():
        deltas, stopped = processor.process(core.step())
        core.finish_requests(stopped)
        for delta in deltas:
            pieces.setdefault(delta.request_id, []).append(delta.text)
    for i in range(len(prompts)):
        final = processor.completion(f"s{i}")
        assert "".join(pieces[f"s{i}"]) == final.text == tok.decode(final.token_ids, skip_special_tokens=True)
        # A piece never ends in half a character: U+FFFD shows up only where the sampled bytes
        # themselves are invalid UTF-8 (then the full decode has it at the same place).
        if "\ufffd" not in final.text:
            assert all("\ufffd" not in piece for piece in pieces[f"s{i}"])
    assert core.kv_cache.all_free()
