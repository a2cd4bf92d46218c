"""Engine-thread CPU a step of the free path and of the constrained path with no grammar work (and
with the real grammar work), the model and the sampling stubbed to nearly nothing: what is left is the
engine's own host work (schedule, prepare, run's bookkeeping, collect, update, outputs)."""
import os, statistics, sys, tempfile, time
sys.path.insert(0, "benchmarks/results/2026-12-05/s24/scripts")
import diag24  # noqa
import torch
torch.set_num_threads(1)
from aioinfer import SamplingParams, LLM
from aioinfer.structured_output import StructuredOutputsParams
from aioinfer.worker.sampler import SamplerOutput
from benchmarks import structured_output_rounds as rounds
from benchmarks.common import ModelShape, fresh_cache_salt, workload1, write_dummy_model
from benchmarks.offline_throughput import STRUCTURED_SCHEMAS
shape = ModelShape("probe", 1, 32, 2, 1, 16, 64, 151936, True)
folder = write_dummy_model(shape, tempfile.mkdtemp())
llm = LLM(model=str(folder), load_format="dummy", dtype="float32", device="cpu", max_model_len=1024, max_num_seqs=256,
          max_num_batched_tokens=8192, tokenizer=".ab/tok", async_scheduling=True)
engine = llm.engine
runner = engine.runner
H = torch.zeros(8192, 32)
runner.model.forward = lambda input_ids, positions, *a, **k: H[:input_ids.shape[0]]
runner.model.compute_logits = lambda hidden, out=None: torch.empty(hidden.shape[0], 151936) if False else L[:hidden.shape[0]]
L = torch.zeros(256, 151936)
Z = torch.zeros(8192, dtype=torch.int64)
runner.sampler = lambda logits, metadata: SamplerOutput(sampled_token_ids=Z[:logits.shape[0]].clone())
runner.grammar_masks.apply = lambda logits, mask: logits
constraint = StructuredOutputsParams(json=STRUCTURED_SCHEMAS["strings"])
OUT = int(os.environ.get("OUTLEN", 300))
reqs = workload1(num_requests=256, max_input_len=200, max_output_len=200, max_token_id=10000)
def go(form):
    params = [SamplingParams(max_tokens=OUT, ignore_eos=True, temperature=0.0,
                             structured_outputs=constraint if form != "free" else None) for r in reqs]
    undo = rounds.VARIANTS["no_grammar_work"](engine) if form == "nogw" else (lambda: None)
    steps = engine.num_steps; c = time.thread_time(); w = time.perf_counter()
    llm.generate([r.prompt for r in reqs], params, use_tqdm=False, cache_salt=fresh_cache_salt())
    c = time.thread_time() - c; w = time.perf_counter() - w; undo()
    n = engine.num_steps - steps
    return 1e3 * c / n, 1e3 * w / n, n
FORMS=("free","nogw")
for f in FORMS: go(f)
res = {f: [] for f in FORMS}
for r in range(int(os.environ.get("ROUNDS", 3))):
    for f in FORMS:
        res[f].append(go(f)); print(f, "cpu %.3f wall %.3f ms/step, %d steps" % res[f][-1], flush=True)
for f, v in res.items():
  if v:  print(f, "median cpu %.3f wall %.3f" % (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v)))
llm.shutdown()
