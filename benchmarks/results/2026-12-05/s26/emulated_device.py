"""Workload 1 (full: prompts 100-1024, outputs 100-1024... scaled by OUTMAX) with an emulated device:
each step's device work takes BASE + PER_TOKEN x tokens from max(its launch, the previous step's end),
and the engine waits for it where it collects. The model and sampling are stubbed (host_paths.py).
FORMS: free, nogw (the constrained path, no grammar work). Prints each run's wall ms and steps."""
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
BASE, PER = float(os.environ.get("BASE", 0.6e-3)), float(os.environ.get("PER", 1e-6))
shape = ModelShape("probe", 1, 32, 2, 1, 16, 64, 151936, True)
folder = write_dummy_model(shape, tempfile.mkdtemp())
llm = LLM(model=str(folder), load_format="dummy", dtype="float32", device="cpu", max_model_len=2048, max_num_seqs=256,
          max_num_batched_tokens=8192, tokenizer=".ab/tok", async_scheduling=True)
engine = llm.engine; runner = engine.runner
H = torch.zeros(8192, 32); L = torch.zeros(256, 151936); Z = torch.zeros(8192, dtype=torch.int64)
runner.model.forward = lambda input_ids, positions, *a, **k: H[:input_ids.shape[0]]
runner.model.compute_logits = lambda hidden, out=None: L[:hidden.shape[0]]
runner.sampler = lambda logits, metadata: SamplerOutput(sampled_token_ids=Z[:logits.shape[0]].clone())
runner.grammar_masks.apply = lambda logits, mask: logits
dev = {"end": 0.0}
ends = {}
run0, collect0 = runner.run, runner.collect
def run(prepared, defer_masks=False):
    launched = run0(prepared, defer_masks)
    n = prepared.inputs.attention.num_tokens if prepared.inputs is not None else 0
    dev["end"] = max(dev["end"], time.perf_counter()) + BASE + PER * n
    ends[id(launched)] = dev["end"]
    return launched
def collect(launched, masks_of=None):
    end = ends.pop(id(launched), 0.0)
    wait = end - time.perf_counter()
    if wait > 0: time.sleep(wait)
    return collect0(launched, masks_of) if masks_of is not None else collect0(launched)
runner.run, runner.collect = run, collect
import aioinfer.worker.model_runner as mr
mr._Launched.__slots__ if hasattr(mr._Launched, "__slots__") else None
constraint = StructuredOutputsParams(json=STRUCTURED_SCHEMAS["strings"])
OUTMAX = int(os.environ.get("OUTMAX", 300))
reqs = workload1(num_requests=256, max_input_len=600, max_output_len=OUTMAX, max_token_id=10000)
def go(form):
    params = [SamplingParams(max_tokens=r.max_tokens, ignore_eos=True, temperature=0.0,
                             structured_outputs=constraint if form != "free" else None) for r in reqs]
    undo = rounds.VARIANTS["no_grammar_work"](engine) if form == "nogw" else (lambda: None)
    steps = engine.num_steps; w = time.perf_counter()
    llm.generate([r.prompt for r in reqs], params, use_tqdm=False, cache_salt=fresh_cache_salt())
    w = time.perf_counter() - w; undo()
    return 1e3 * w, engine.num_steps - steps
for f in ("free", "nogw"): go(f)
res = {"free": [], "nogw": []}
for r in range(int(os.environ.get("ROUNDS", 4))):
    for f in ("free", "nogw"):
        res[f].append(go(f))
for f, v in res.items():
    print(f, "wall ms", " ".join("%.0f" % x[0] for x in v), "steps", " ".join(str(x[1]) for x in v), "median %.0f" % statistics.median(x[0] for x in v))
