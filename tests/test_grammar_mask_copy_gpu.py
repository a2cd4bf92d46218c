"""CUDA: the masks' host-to-device copy, started by the engine thread on a stream of its own once the
grammar worker has computed them (worker/grammar_mask.py ``poll``, ``_copy_to_device``), is waited
for before sampling. Steps scheduled ahead
(async scheduling, masks deferred to the worker) must give every constrained request the same greedy
tokens as lockstep steps (masks filled at launch), and every token must be one the grammar accepts:
a mask read before its copy landed would let a disallowed token through."""

from __future__ import annotations

import pytest
import torch

from aioinfer import LLM, SamplingParams
from aioinfer.structured_output import StructuredOutputsParams
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
            assert llm.engine.runner.num_deferred_steps > 0  # the worker's copies were used
        llm.shutdown()
    assert tokens[True] == tokens[False]
