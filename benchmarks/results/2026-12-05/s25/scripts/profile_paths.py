"""Twenty-fifth session: where the constrained step's engine-thread time goes, function by function.

Workload 1 on the 0.5b shape (dummy weights), as structured_output_rounds builds it: one free and one
constrained run under cProfile (the engine thread is the caller's in LLM.generate), each after an
unprofiled warm run of both forms; then no_grammar_work (the constrained path with a grammar engine
that costs nothing) profiled too. Writes each form's pstats to OUT/prof_<form>.pstats and prints the
functions whose own time a step differs most between free and no grammar work (cProfile's own overhead inflates
Python-heavy code; the differences between forms are the point)."""
import cProfile
import os
import pstats
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../../s24/scripts"))
import diag24  # noqa: E402,F401  (registers no_grammar_work and the rest)

import torch  # noqa: E402

from aioinfer import SamplingParams  # noqa: E402
from aioinfer.structured_output import StructuredOutputsParams  # noqa: E402
from benchmarks import structured_output_rounds as rounds  # noqa: E402
from benchmarks.common import SHAPES, ModelShape, fresh_cache_salt, make_llm, workload1, write_dummy_model  # noqa: E402
from benchmarks.offline_throughput import STRUCTURED_SCHEMAS  # noqa: E402

out = os.environ.get("OUT", "/tmp")
# SMOKE=1: a CPU check of the script itself (one layer of width 32, Qwen2.5's vocabulary, 16 short requests).
smoke = os.environ.get("SMOKE") == "1"
shape = ModelShape("probe", 1, 32, 2, 1, 16, 64, 151936, True) if smoke else SHAPES["qwen2.5-0.5b"]
device = "cpu" if smoke else "cuda"
folder = write_dummy_model(shape, tempfile.mkdtemp())
llm, _ = make_llm(str(folder), device, None, None, max_model_len=2048, max_num_seqs=256,
                  max_num_batched_tokens=8192, tokenizer=".ab/tok",
                  **({"async_scheduling": True} if smoke else {"gpu_memory_utilization": 0.9}))
engine = llm.engine
constraint = StructuredOutputsParams(json=STRUCTURED_SCHEMAS["strings"])
requests = workload1(max_token_id=10000)
if smoke:
    requests = [type(r)(r.prompt[:20], 8) for r in requests[:16]]


def go(constrained: bool, profile: "cProfile.Profile | None" = None) -> tuple[float, int]:
    params = [SamplingParams(max_tokens=r.max_tokens, ignore_eos=True, temperature=0.0,
                             structured_outputs=constraint if constrained else None) for r in requests]
    steps = engine.num_steps
    if not smoke:
        torch.cuda.synchronize()
    start = time.perf_counter()
    if profile:
        profile.enable()
    llm.generate([r.prompt for r in requests], params, use_tqdm=False, cache_salt=fresh_cache_salt())
    if profile:
        profile.disable()
    if not smoke:
        torch.cuda.synchronize()
    return time.perf_counter() - start, engine.num_steps - steps


go(False), go(True), go(False), go(True)
stats = {}
for form in ("free", "constrained", "no_grammar_work", "free2", "constrained2"):
    undo = rounds.VARIANTS["no_grammar_work"](engine) if form == "no_grammar_work" else (lambda: None)
    prof = cProfile.Profile()
    seconds, steps = go(form != "free" and form != "free2", prof)
    undo()
    prof.dump_stats(f"{out}/prof_{form}.pstats")
    st = pstats.Stats(prof)
    stats[form] = (st, steps)
    print(f"{form}: {seconds:.2f} s, {steps} steps, {1e3 * seconds / steps:.3f} ms a step under the profiler", flush=True)


def per_step(form):
    st, steps = stats[form]
    return {f"{os.path.basename(k[0])}:{k[1]}:{k[2]}": (v[2] * 1e6 / steps, v[1] / steps, v[3] * 1e6 / steps)
            for k, v in st.stats.items()}


free, cons, nogw = per_step("free"), per_step("constrained"), per_step("no_grammar_work")
zero = (0.0, 0.0, 0.0)
for name in ("engine_core.py:99:step_with_details", "model_runner.py:177:run", "model_runner.py:224:finish",
             "model_runner.py:271:collect", "model_runner.py:126:launch", "model_runner.py:135:prepare"):
    print(f"cumulative a step, {name}: free {free.get(name, zero)[2]:.1f}, constrained {cons.get(name, zero)[2]:.1f}, "
          f"no grammar work {nogw.get(name, zero)[2]:.1f} us")
keys = set(free) | set(cons) | set(nogw)
rows = sorted(keys, key=lambda k: -abs(nogw.get(k, zero)[0] - free.get(k, zero)[0]))
print(f"{'function':70s} {'free us':>8s} {'cons us':>8s} {'nogw us':>8s} {'calls/step f/c':>16s}")
for k in rows[:60]:
    f, c, n = free.get(k, zero), cons.get(k, zero), nogw.get(k, zero)
    print(f"{k[-70:]:70s} {f[0]:8.1f} {c[0]:8.1f} {n[0]:8.1f} {f[1]:7.2f}/{c[1]:7.2f}")
print("total tottime a step (us):", {form: round(sum(v[0] for v in per_step(form).values()), 1) for form in stats})
llm.shutdown()
