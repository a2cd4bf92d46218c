"""CUDA: the masks of steps launched ahead reach the apply as it reads them: the slots' pinned host
rows copied to device rows on a stream of the engine's, waited for before sampling
(structured_output/mask_slots.py), give the reference's logits. Steps scheduled ahead (async scheduling, masks
deferred to the worker) must give every constrained request the same greedy tokens as lockstep steps
(masks filled at launch), and every token must be one the grammar accepts: a mask read before its
copy landed would let a disallowed token through."""

from __future__ import annotations

import pytest
import torch

from aioinfer import LLM, SamplingParams
from aioinfer.structured_output import StructuredOutputsParams
from aioinfer.structured_output.bitmask_apply import apply_bitmask, apply_bitmask_reference
from aioinfer.structured_output.mask_slots import MaskSlots
from json_schemas import schemas
from tiny_models import make_tiny_model_dir

pytestmark = pytest.mark.gpu


def test_worker_copied_masks_equal_lockstep_masks(tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    folder = make_tiny_model_dir(tmp_path, arch="qwen2")
    generated = schemas(24)
    prompts = [f"request {i}: a JSON value" for i in range(72)]
    params = [SamplingParams(max_tokens=48, temperature=0.0,
                             structured_outputs=StructuredOutputsParams(json=generated[i % len(generated)]))
              for i in range(len(prompts))]
    tokens = {}
    for async_scheduling in (True, False):
        llm = LLM(model=str(folder), device="cuda", dtype="float32", gpu_memory_utilization=0.2,
                  max_model_len=512, async_scheduling=async_scheduling)
        outputs = llm.generate(prompts, params, use_tqdm=False)
        tokens[async_scheduling] = [list(o.outputs[0].token_ids) for o in outputs]
        eos = set(llm.inputs.eos_token_ids)
        for p, ids in zip(params, tokens[async_scheduling]):
            matcher = llm.inputs.grammars.compile(p.structured_outputs)
            assert matcher.consume_tokens([t for t in ids if t not in eos]), (p.structured_outputs, ids)
        if async_scheduling:
            assert llm.engine.executor.runner.num_deferred_steps > 0  # the worker's copies were used
        llm.shutdown()
    assert tokens[True] == tokens[False]


def test_the_apply_masks_from_a_slot_as_the_reference_does():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    device = torch.device("cuda")
    vocab = 151936
    num_words = (vocab + 31) // 32
    slots = MaskSlots(num_words, device, rows=4)
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn((6, vocab), generator=generator).to(device)
    rows = torch.tensor([0, 3, 5])
    for step in range(4):  # the slots in turn, rows written again two takes later
        slot = slots.take(3)
        slot.host[:3] = torch.randint(-2**31, 2**31 - 1, (3, num_words), generator=generator, dtype=torch.int32)
        slots.start_copy(slot, 3)
        bits = slots.apply_rows(slot, 3)
        assert bits.is_cuda and bits.data_ptr() == slot.device.data_ptr()  # the copy, not the host rows
        masked = apply_bitmask(logits.clone(), bits, rows.to(device))
        expected = apply_bitmask_reference(logits.cpu(), slot.host[:3].clone(), rows)
        assert torch.equal(masked.cpu(), expected), step
    slots.close()
