"""A real Qwen2.5 model: Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF), loaded by our own GGUF loader
(qwen2 architecture: q/k/v bias, no q/k permutation), against transformers' load of the same file."""

from __future__ import annotations

import pytest
import torch

from aioinfer import LLM, SamplingParams

pytestmark = pytest.mark.slow

MAX_TOKENS = 16


def test_greedy_tokens_equal_transformers(qwen25_coder_gguf):
    from transformers import AutoModelForCausalLM

    llm = LLM(model=str(qwen25_coder_gguf), dtype="float32", device="cpu", max_model_len=1024)
    tok = llm.get_tokenizer()
    chat = tok.apply_chat_template([{"role": "user", "content": "Write a Python function that adds two numbers."}],
                                   add_generation_prompt=True, tokenize=False)
    prompts = [tok.encode(chat, add_special_tokens=False), tok.encode("# 计算斐波那契数列\ndef fib(n):")]
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=MAX_TOKENS), use_tqdm=False)
    del llm

    hf = AutoModelForCausalLM.from_pretrained(qwen25_coder_gguf.parent, gguf_file=qwen25_coder_gguf.name,
                                              dtype=torch.float32).eval()
    for prompt, out in zip(prompts, outputs):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                              max_new_tokens=MAX_TOKENS, do_sample=False)[0, len(prompt):].tolist()
        assert out.outputs[0].token_ids == ref, f"{tok.decode(out.outputs[0].token_ids)!r} != {tok.decode(ref)!r}"
        assert out.outputs[0].text == tok.decode(ref, skip_special_tokens=True)
