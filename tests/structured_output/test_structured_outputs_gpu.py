"""Structured outputs on CUDA: the pinned mask copy and the device-side apply, with CUDA graphs and
async scheduling (the engine's defaults there), equal to the CPU path's masks and valid outputs."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch

from aioinfer import LLM, SamplingParams
from aioinfer.structured_output import StructuredOutputsParams
from aioinfer.structured_output.compiler import GrammarCompiler
from aioinfer.structured_output.grammar_mask import GrammarMasks
from aioinfer.sample.sampling_metadata import SamplingRow
from json_schemas import schemas

pytestmark = pytest.mark.gpu


def test_device_apply_equals_cpu_apply(smollm2_tokenizer):
    vocab = 49152
    compiler = GrammarCompiler(smollm2_tokenizer, vocab, [2])
    logits = torch.randn(3, vocab)
    out = {}
    for device in ("cpu", "cuda"):
        rows = [SamplingRow(SamplingParams(), [1], [], 0, (2,), grammar=compiler.compile(StructuredOutputsParams(json=s)))
                for s in schemas(2)]
        rows.insert(1, SamplingRow(SamplingParams(), [1], [], 0, (2,)))
        masks = GrammarMasks(vocab, torch.device(device))
        out[device] = masks.apply(logits.clone().to(device), masks.fill(rows, None)).cpu()
    assert torch.equal(out["cpu"], out["cuda"])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gpu_schemas_validate(smollm2_gguf, dtype):
    llm = LLM(model=str(smollm2_gguf), device="cuda", dtype=dtype, gpu_memory_utilization=0.3, max_model_len=2048)
    tokenizer = llm.get_tokenizer()
    generated = schemas(50)
    prompts = [tokenizer.encode(tokenizer.apply_chat_template(
        [{"role": "user", "content": "Give one example JSON value for this schema: " + json.dumps(s)}],
        tokenize=False, add_generation_prompt=True), add_special_tokens=False) for s in generated]
    params = [SamplingParams(temperature=0, max_tokens=256, structured_outputs=StructuredOutputsParams(json=s))
              for s in generated]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    for schema, output in zip(generated, outputs):
        assert output.outputs[0].finish_reason == "stop", output.outputs[0].text
        jsonschema.validate(json.loads(output.outputs[0].text), schema)
    alone = llm.generate([prompts[3]], params[3], use_tqdm=False)[0].outputs[0]
    if dtype == "float32":
        assert alone.token_ids == outputs[3].outputs[0].token_ids


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_apply_equals_reference(dtype):
    """One Triton launch sets exactly the logits the CPU reference does (all rows or a subset, in
    float32 and bfloat16, a vocabulary that does not fill its last word), and leaves the rest bit for bit."""
    from aioinfer.structured_output.bitmask_apply import apply_bitmask_reference, apply_bitmask_triton

    generator = torch.Generator().manual_seed(1)
    vocab = 151_936 + 3
    words = (vocab + 31) // 32
    bits = torch.randint(-2**31, 2**31 - 1, (6, words), dtype=torch.int32, generator=generator)
    logits = torch.randn(9, vocab, generator=generator).to(dtype)
    for rows in (None, torch.tensor([8, 0, 3, 4, 7, 1])):
        subset = logits[:6] if rows is None else logits
        expected = apply_bitmask_reference(subset.clone(), bits, rows)
        got = apply_bitmask_triton(subset.clone().cuda(), bits.cuda(), None if rows is None else rows.cuda()).cpu()
        assert torch.equal(got, expected)
