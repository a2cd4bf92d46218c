"""Batch-1 decode step phases on the GPU (diagnostic): CUDA-event times of the input copies, the
decode graph replay and the logits / sampling tail, plus host times, per decode step.

    PYTHONPATH=. python3 benchmarks/decode_phases.py 256 1   # token graphs up to 256 tokens, async on
    DIAG_VARIANT=drop PYTHONPATH=. python3 benchmarks/decode_phases.py 256 1

argv: max_cuda_graph_prefill_tokens, async scheduling (0/1), [model]. DIAG_VARIANT changes how the
token graphs exist: base; noreplay (captured, never replayed); decfirst (decode graphs captured
first); decfirst_sep / sep (separate memory pools); drop (token graphs destroyed before timing).
Written to find why 7b batch-1 decode graphs replay slower when token graphs are captured
(H200, 2026-11-29).
"""
import os
import statistics
import sys
import tempfile
import time

import torch

from benchmarks.common import SHAPES, make_llm, write_dummy_model, workload2, fresh_cache_salt
from aioinfer import SamplingParams

tok, use_async = int(sys.argv[1]), bool(int(sys.argv[2]))
from aioinfer.worker import cuda_graphs as cg
variant = os.environ.get("DIAG_VARIANT", "base")
if variant in ("sep", "decfirst", "decfirst_sep"):
    def capture(self):
        buf = self.inputs
        pool_d = torch.cuda.graph_pool_handle()
        pool_t = torch.cuda.graph_pool_handle() if variant.endswith("sep") else pool_d
        def tokens():
            for num_tokens in reversed(self.token_buckets):
                num_seqs = self.token_seqs(num_tokens)
                buf.token_query_start_loc[1:num_seqs + 1].fill_(num_tokens)
                buf.seq_lens[:num_seqs].fill_(0); buf.seq_lens[0].fill_(num_tokens)
                buf.block_tables[:num_seqs].zero_(); buf.slot_mapping[:num_tokens].fill_(-1)
                self._token_graphs[num_tokens] = self._capture(pool_t, self.token_metadata(num_tokens), num_tokens)
            buf.seq_lens.fill_(1)
        def decode():
            for b in reversed(self.buckets):
                self._graphs[b] = self._capture(pool_d, self.metadata(b), b)
        if variant.startswith("decfirst"):
            decode(); tokens()
        else:
            tokens(); decode()
        torch.cuda.synchronize()
    cg.CudaGraphRunner.capture = capture
if variant == "noreplay":
    orig_can = cg.CudaGraphRunner.can_run
    cg.CudaGraphRunner.can_run = lambda self, inputs: inputs.is_decode_only and orig_can(self, inputs)
print("variant", variant, flush=True)
model = sys.argv[3] if len(sys.argv) > 3 else "qwen2.5-7b"
with tempfile.TemporaryDirectory() as tmp:
    folder = write_dummy_model(SHAPES[model], tmp)
    llm, _ = make_llm(folder, "cuda", None, None, max_model_len=400, max_num_seqs=1, gpu_memory_utilization=0.5,
                      max_cuda_graph_prefill_tokens=tok, async_scheduling=use_async)
runner = llm.engine.runner
graphs = runner.graphs
if variant == "drop":  # the token graphs destroyed before any timing: does their existence matter?
    import gc
    graphs._token_graphs.clear(); gc.collect(); torch.cuda.synchronize(); torch.cuda.empty_cache()
rec = []  # per launch: dict of host times and events
cur = {}
orig_prepare = runner.inputs.prepare
def prepare(sched):
    cur.clear()
    cur["e0"] = torch.cuda.Event(enable_timing=True); cur["e0"].record()
    t = time.perf_counter(); out = orig_prepare(sched); cur["h_prepare"] = time.perf_counter() - t
    return out
runner.inputs.prepare = prepare
orig_run = graphs.run
def run(inputs):
    cur["e1"] = torch.cuda.Event(enable_timing=True); cur["e1"].record()
    t = time.perf_counter(); out = orig_run(inputs); cur["h_replay"] = time.perf_counter() - t
    cur["e2"] = torch.cuda.Event(enable_timing=True); cur["e2"].record()
    cur["decode"] = inputs.is_decode_only
    return out
graphs.run = run
orig_launch = runner.launch
def launch(so):
    t = time.perf_counter(); out = orig_launch(so); cur["h_launch"] = time.perf_counter() - t
    cur["e3"] = torch.cuda.Event(enable_timing=True); cur["e3"].record()
    cur["t_launch_end"] = time.perf_counter()
    if "e1" in cur:
        rec.append(dict(cur))
    return out
runner.launch = launch
orig_collect = runner.collect
def collect(l):
    t = time.perf_counter(); out = orig_collect(l); w = time.perf_counter() - t
    if rec: rec[-1].setdefault("h_collect_calls", []).append(w)
    return out
runner.collect = collect
prompts = [r.prompt for r in workload2(1)]
params = SamplingParams(max_tokens=200, ignore_eos=True, temperature=0.0)
llm.generate(prompts, SamplingParams(max_tokens=8, ignore_eos=True, temperature=0.0), use_tqdm=False)
for rep in range(2):
    rec.clear()
    torch.cuda.synchronize(); t0 = time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False, cache_salt=fresh_cache_salt())
    torch.cuda.synchronize(); wall = time.perf_counter() - t0
    dec = [r for r in rec if r.get("decode")][5:-5]
    def med(f): return statistics.median(f(r) for r in dec)
    gap = statistics.median(dec[i]["e0"].elapsed_time(dec[i+1]["e0"]) for i in range(len(dec)-1))
    print(f"{variant} tok={tok} async={int(use_async)} rep={rep} wall/step {1e3*wall/len(rec):.3f} ms | gpu e0->e0 {gap:.3f} "
          f"copies(e0-e1) {med(lambda r: r['e0'].elapsed_time(r['e1'])):.3f} graph(e1-e2) {med(lambda r: r['e1'].elapsed_time(r['e2'])):.3f} "
          f"post(e2-e3) {med(lambda r: r['e2'].elapsed_time(r['e3'])):.3f} | host prepare {1e3*med(lambda r: r['h_prepare']):.3f} "
          f"replay {1e3*med(lambda r: r['h_replay']):.3f} launch {1e3*med(lambda r: r['h_launch']):.3f} "
          f"steps {len(rec)} prefill-graph {[r.get('decode') for r in rec[:2]]}", flush=True)
    # GPU idle between e3 (end of step N's work enqueue) and e0 of step N+1
    idle = statistics.median(dec[i]["e3"].elapsed_time(dec[i+1]["e0"]) for i in range(len(dec)-1))
    print(f"   gpu e3(N)->e0(N+1) {idle:.3f} ms", flush=True)
