"""Diagnostic: where a constrained step's time goes, on the GPU and on the host, without phase timers
(a few events a step). GPU: CUDA events at run() entry/exit and finish() entry / _sample exit, so the
stream's idle gaps show (waiting for the masks, waiting for the next launch). Host: perf_counter at the
engine thread's waits (mask future, collect's sync) and the worker's consume / masks."""
import statistics, sys, time, json
import torch
from benchmarks import structured_output_rounds as rounds
from aioinfer.worker import model_runner, grammar_mask
from aioinfer.worker.model_runner import ModelRunner
from aioinfer.worker.grammar_mask import GrammarMasks

EV = []  # (step, name, event)
HOST = {}  # name -> list of seconds
ON = [False]

def rec(name):
    if ON[0]:
        e = torch.cuda.Event(enable_timing=True); e.record(); EV.append((name, e))

def add(name, s):
    if ON[0]:
        HOST.setdefault(name, []).append(s)

orig_run, orig_finish, orig_sample, orig_collect = ModelRunner.run, ModelRunner.finish, ModelRunner._sample, ModelRunner.collect
def run(self, prepared, defer_masks=False):
    rec("run_in"); out = orig_run(self, prepared, defer_masks); rec("run_out"); return out
def finish(self, launched):
    if launched.logits is None:
        return orig_finish(self, launched)
    rec("finish_in"); t = time.perf_counter(); out = orig_finish(self, launched); add("finish_host", time.perf_counter() - t); return out
def _sample(self, launched, logits, mask):
    out = orig_sample(self, launched, logits, mask); rec("sample_out"); return out
def collect(self, launched, masks_of=None):
    t = time.perf_counter(); out = orig_collect(self, launched, masks_of); add("collect_host", time.perf_counter() - t); return out
ModelRunner.run, ModelRunner.finish, ModelRunner._sample, ModelRunner.collect = run, finish, _sample, collect

orig_ff = GrammarMasks.finish_fill
def finish_fill(self, pending):
    if pending is not None and pending.future is not None:
        t = time.perf_counter(); pending.future.result(); add("mask_wait", time.perf_counter() - t)
    return orig_ff(self, pending)
GrammarMasks.finish_fill = finish_fill

class Proxy:
    def __init__(self, ex): self.ex = ex
    def consume_token_par(self, live):
        t = time.perf_counter(); r = self.ex.consume_token_par(live); add("w_consume", time.perf_counter() - t); self.t_after = time.perf_counter(); return r
    def unsafe_compute_mask_ptr(self, *a):
        t = time.perf_counter(); add("w_gap", t - getattr(self, "t_after", t)); r = self.ex.unsafe_compute_mask_ptr(*a); add("w_masks", time.perf_counter() - t); return r
    def unsafe_compute_mask_ptr_with_draft_token(self, *a): return self.ex.unsafe_compute_mask_ptr_with_draft_token(*a)
orig_llg = GrammarMasks._llg_executor
def _llg_executor(self):
    ex = orig_llg(self)
    if not isinstance(ex, Proxy):
        self._executor = ex = Proxy(ex)
    return ex
GrammarMasks._llg_executor = _llg_executor

def summarize(label):
    torch.cuda.synchronize()
    gaps = {}
    prev = None
    for name, e in EV:
        if prev is not None:
            gaps.setdefault(f"{prev[0]}->{name}", []).append(prev[1].elapsed_time(e))
        prev = (name, e)
    print(f"== {label}: GPU ms between stream marks (mean over steps, count)")
    for k, v in sorted(gaps.items(), key=lambda kv: -sum(kv[1])):
        print(f"   {k:28s} {statistics.mean(v):.3f} ms  (n={len(v)}, sum {sum(v):.0f} ms)")
    print(f"== {label}: host ms (mean, count)")
    for k, v in HOST.items():
        print(f"   {k:28s} {1e3*statistics.mean(v):.3f} ms  (n={len(v)})")
    EV.clear(); HOST.clear()

def timeline(engine):
    ON[0] = True
    def undo():
        ON[0] = False
        summarize("constrained")
    return undo

def timeline_free(engine):
    """The same requests with their grammar dropped at admission: a free run, timed the same way."""
    orig = engine.add_request
    def add_request(request):
        request.grammar = None
        return orig(request)
    engine.add_request = add_request
    ON[0] = True
    def undo():
        ON[0] = False
        del engine.add_request
        summarize("free")
    return undo

rounds.VARIANTS["timeline"] = timeline
rounds.VARIANTS["timeline_free"] = timeline_free

def side_copy(engine):
    grammar_mask.MASK_COPY_STREAM = True
    def undo():
        grammar_mask.MASK_COPY_STREAM = False
    return undo

rounds.VARIANTS["side_copy"] = side_copy

if __name__ == "__main__":
    rounds.main()
