"""CUDA check of the masks' copy on its own stream: constrained greedy outputs of the dummy 0.5b model
(async scheduling with deferred masks, the worker's copy) must be accepted by the grammar token by
token and equal the lockstep engine's (masks filled at launch)."""
import sys, tempfile
sys.path.insert(0, "tests")
import torch
from json_schemas import schemas
from aioinfer import LLM, SamplingParams
from aioinfer.structured_output import StructuredOutputsParams
from benchmarks.common import SHAPES, write_dummy_model

folder = write_dummy_model(SHAPES["qwen2.5-0.5b"], tempfile.mkdtemp())
prompts = [f"Request {i}: write the JSON object." for i in range(96)]
gen = schemas(48)
params = [SamplingParams(max_tokens=96, temperature=0.0, structured_outputs=StructuredOutputsParams(json=gen[i % 48]))
          for i in range(96)]
outs = {}
for mode in (True, False):
    llm = LLM(model=str(folder), load_format="dummy", dtype="bfloat16", device="cuda", tokenizer=".ab/tok",
              gpu_memory_utilization=0.3, max_model_len=2048, async_scheduling=mode)
    res = llm.generate(prompts, params, use_tqdm=False)
    outs[mode] = [list(r.outputs[0].token_ids) for r in res]
    compiler = llm.engine_inputs_grammars if hasattr(llm, "engine_inputs_grammars") else llm.inputs.grammars
    bad = 0
    for p, toks in zip(params, outs[mode]):
        m = compiler.compile(p.structured_outputs)
        body = [t for t in toks if t not in (151643, 151645)]
        if not m.consume_tokens(body):
            bad += 1
    print(f"async_scheduling={mode}: {len(res)} outputs, {sum(map(len, outs[mode]))} tokens, grammar violations {bad}, deferred steps {llm.engine.runner.num_deferred_steps}")
    del llm
    torch.cuda.empty_cache()
same = sum(a == b for a, b in zip(outs[True], outs[False]))
print(f"async == lockstep: {same}/{len(prompts)}")
assert same == len(prompts)
