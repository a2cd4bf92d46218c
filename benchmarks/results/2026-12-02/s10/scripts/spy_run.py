"""Workload 1 three times in one engine, free or constrained, for py-spy to sample."""
import sys, tempfile, time
import torch
from aioinfer import SamplingParams
from aioinfer.structured_output import StructuredOutputsParams
from benchmarks.common import SHAPES, fresh_cache_salt, make_llm, workload1, write_dummy_model
from benchmarks.offline_throughput import STRUCTURED_SCHEMAS
constrained = sys.argv[1] == "json"
shape = SHAPES["qwen2.5-0.5b"]
folder = write_dummy_model(shape, tempfile.mkdtemp())
llm, _ = make_llm(str(folder), "cuda", None, None, max_model_len=2048, max_num_seqs=256,
                  max_num_batched_tokens=8192, gpu_memory_utilization=0.9, tokenizer=".ab/tok")
c = StructuredOutputsParams(json=STRUCTURED_SCHEMAS["strings"]) if constrained else None
def go(reqs):
    ps = [SamplingParams(max_tokens=r.max_tokens, ignore_eos=True, temperature=0.0, structured_outputs=c) for r in reqs]
    t = time.perf_counter()
    outs = llm.generate([r.prompt for r in reqs], ps, use_tqdm=False, cache_salt=fresh_cache_salt())
    torch.cuda.synchronize()
    n = sum(len(o.outputs[0].token_ids) for o in outs)
    print(sys.argv[1], f"{n / (time.perf_counter() - t):,.0f} tok/s", flush=True)
go(workload1(num_requests=4, seed=1, max_input_len=200, max_output_len=110, max_token_id=500))
reqs = workload1(max_token_id=10000)[:256]
print("TIMED", flush=True)
for _ in range(3):
    go(reqs)
