"""Per-function engine-thread time (perf_counter_ns, inclusive) a steady decode step, nogw, stubbed engine."""
import os, statistics, time, collections, functools
os.environ["ROUNDS"] = "0"
exec(open("benchmarks/results/2026-12-05/s25/scripts/host_paths.py").read().replace("llm.shutdown()", ""))
from aioinfer.worker import grammar_mask as gm, model_runner as mr
from aioinfer.engine import engine_core as ec
P = time.perf_counter_ns
tot = collections.Counter(); calls = collections.Counter()
def wrap(owner, name, label):
    f = getattr(owner, name)
    @functools.wraps(f)
    def w(*a, **k):
        t = P()
        try: return f(*a, **k)
        finally: tot[label] += P() - t; calls[label] += 1
    setattr(owner, name, w)
masks = runner.grammar_masks
for owner, name in [(masks, "plan"), (masks, "poll"), (masks, "finish_fill"), (masks, "_take_job"), (runner, "finish"),
                    (runner, "poll_masks"), (runner, "_sample"), (runner, "collect"), (runner, "run"), (runner, "prepare"),
                    (engine, "_grammars_alive"), (engine, "_finish_deferred"), (runner._sampling_metadata, "build")]:
    wrap(owner, name, name)
gm_live = gm.live_tokens
def live(*a):
    t = P(); r = gm_live(*a); tot["live_tokens"] += P() - t; calls["live_tokens"] += 1; return r
mr.live_tokens = live
def go2(form):
    params = [SamplingParams(max_tokens=OUT, ignore_eos=True, temperature=0.0,
                             structured_outputs=constraint if form != "free" else None) for r in reqs]
    undo = rounds.VARIANTS["no_grammar_work"](engine) if form == "nogw" else (lambda: None)
    if form == "nogw":
        wrap(masks, "start", "start")
    tot.clear(); calls.clear(); n0 = engine.num_steps
    llm.generate([r.prompt for r in reqs], params, use_tqdm=False, cache_salt=fresh_cache_salt())
    undo()
    n = engine.num_steps - n0
    return {k: (v / n / 1e3, calls[k] / n) for k, v in tot.items()}
for form in ("free", "nogw"):
    go2(form)
    rs = [go2(form) for _ in range(3)]
    print(form)
    for k in sorted(rs[0], key=lambda k: -rs[0][k][0]):
        print(f"  {k:18s} {statistics.median(r[k][0] for r in rs):7.1f} us/step  {rs[0][k][1]:.2f} calls/step")
