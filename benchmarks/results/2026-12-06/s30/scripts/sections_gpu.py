"""Thirtieth session: where the constrained step's extra host time goes, on the GPU host, function by
function, without a profiler's per-call overhead on everything: only the engine's own phases are
wrapped (about 20 timed calls a step, the same in every form), each timed by the engine thread's
CPU clock and the wall clock. Workload 1 on the 0.5b shape (dummy weights) as
structured_output_rounds builds it; forms free, constrained and no_grammar_work (diag19's: the
constrained path with a grammar engine that costs nothing), alternating for ROUNDS rounds after one
warm run each. Per form the median over rounds of each function's µs a step (CPU, wall); the
device wait inside ``collect`` (the sampled ids' event) is timed apart, so that ``collect`` less it
is host work. ``outer`` is the offline loop's own work between steps (its output processing).

SMOKE=1: a CPU check of the script itself (one layer of width 32, Qwen2.5's vocabulary, 16 short
requests)."""
import collections
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../../../2026-12-05/s24/scripts"))
import diag24  # noqa: E402,F401  (registers no_grammar_work and the rest; its sync timer wraps _copy_to_host)

import torch  # noqa: E402

from aioinfer import SamplingParams  # noqa: E402
from aioinfer.engine import engine_core  # noqa: E402
from aioinfer.structured_output import StructuredOutputsParams  # noqa: E402
from aioinfer.worker import model_runner  # noqa: E402
from benchmarks import structured_output_rounds as rounds  # noqa: E402
from benchmarks.common import SHAPES, ModelShape, fresh_cache_salt, make_llm, workload1, write_dummy_model  # noqa: E402
from benchmarks.offline_throughput import STRUCTURED_SCHEMAS  # noqa: E402

out = os.environ.get("OUT", "/tmp")
smoke = os.environ.get("SMOKE") == "1"
ROUNDS = int(os.environ.get("ROUNDS", "4"))
shape = ModelShape("probe", 1, 32, 2, 1, 16, 64, 151936, True) if smoke else SHAPES["qwen2.5-0.5b"]
device = "cpu" if smoke else "cuda"
folder = write_dummy_model(shape, tempfile.mkdtemp())
llm, _ = make_llm(str(folder), device, None, None, max_model_len=2048, max_num_seqs=256,
                  max_num_batched_tokens=8192, tokenizer=".ab/tok",
                  **({"async_scheduling": True} if smoke else {"gpu_memory_utilization": 0.9}))
engine = llm.engine
runner = engine.runner
constraint = StructuredOutputsParams(json=STRUCTURED_SCHEMAS["strings"])
requests = workload1(max_token_id=10000)
if smoke:
    requests = [type(r)(r.prompt[:20], 8) for r in requests[:16]]

CPU, WALL = time.thread_time_ns, time.perf_counter_ns
spent = collections.defaultdict(lambda: [0, 0, 0])  # name -> [cpu ns, wall ns, calls]


def timed(owner, attr, name=None):
    """Wrap ``owner.attr`` (an instance's bound method or a module's function) with both clocks."""
    inner = getattr(owner, attr)
    key = name or attr
    cell = spent[key]

    def wrapper(*args, **kwargs):
        c, w = CPU(), WALL()
        try:
            return inner(*args, **kwargs)
        finally:
            cell[0] += CPU() - c
            cell[1] += WALL() - w
            cell[2] += 1
    setattr(owner, attr, wrapper)


timed(engine, "step_with_details", "step")
timed(engine.scheduler, "schedule")
timed(engine.scheduler, "update")
for attr in ("prepare", "run", "finish", "collect", "poll_masks", "_sample"):
    timed(runner, attr)
timed(runner._sampling_metadata, "build", "metadata_build")
masks = runner.grammar_masks
for attr in ("plan", "poll", "finish_fill"):
    timed(masks, attr, "masks." + attr)
# start and advance on the class: no_grammar_work sets (and its undo deletes) instance attributes of those
timed(type(masks), "start", "masks.start")
timed(type(masks), "advance", "masks.advance")
timed(runner.inputs, "prepare", "inputs.prepare")
if runner.graphs is not None:
    timed(runner.graphs, "run", "graphs.run")
timed(model_runner, "masked_greedy")
timed(model_runner, "live_tokens")
timed(model_runner, "_copy_to_host", "copy_to_host")  # diag's wrapper inside: its event times the wait


def go(form: str) -> dict:
    params = [SamplingParams(max_tokens=r.max_tokens, ignore_eos=True, temperature=0.0,
                             structured_outputs=None if form == "free" else constraint) for r in requests]
    undo = rounds.VARIANTS["no_grammar_work"](engine) if form == "no_grammar_work" else (lambda: None)
    for cell in spent.values():
        cell[:] = [0, 0, 0]
    sync0 = rounds.COUNTERS["sync_wait"]()
    steps = engine.num_steps
    if not smoke:
        torch.cuda.synchronize()
    c, w = CPU(), WALL()
    try:
        llm.generate([r.prompt for r in requests], params, use_tqdm=False, cache_salt=fresh_cache_salt())
    finally:
        undo()
    if not smoke:
        torch.cuda.synchronize()
    c, w = CPU() - c, WALL() - w
    n = max(1, engine.num_steps - steps)
    row = {k: (v[0] / n / 1e3, v[1] / n / 1e3, v[2] / n) for k, v in spent.items()}
    sync = (rounds.COUNTERS["sync_wait"]() - sync0) / n * 1e6
    row["sync_wait"] = (sync, sync, 1.0)
    row["collect-sync"] = (row["collect"][0] - sync, row["collect"][1] - sync, 1.0)
    row["outer"] = (c / n / 1e3 - row["step"][0], w / n / 1e3 - row["step"][1], 1.0)
    row["whole"] = (c / n / 1e3, w / n / 1e3, 1.0)
    return row


FORMS = os.environ.get("FORMS", "free,constrained,no_grammar_work").split(",")
for form in FORMS:
    go(form)
results = {form: [] for form in FORMS}
for r in range(ROUNDS):
    for form in FORMS[r % len(FORMS):] + FORMS[:r % len(FORMS)]:
        results[form].append(go(form))
        print(f"round {r} {form}: {results[form][-1]['whole'][1]:.1f} us a step", flush=True)
with open(f"{out}/sections.json", "w") as f:
    json.dump(results, f)
names = sorted({k for rows in results.values() for row in rows for k in row},
               key=lambda k: -statistics.median(row.get(k, (0, 0, 0))[1] for row in results[FORMS[1 % len(FORMS)]]))
print(f"{'us a step (cpu / wall)':24s} " + " ".join(f"{f:>22s}" for f in FORMS) + "   calls a step")
for k in names:
    cells = []
    for f in FORMS:
        rows = results[f]
        cpu = statistics.median(row.get(k, (0, 0, 0))[0] for row in rows)
        wall = statistics.median(row.get(k, (0, 0, 0))[1] for row in rows)
        cells.append(f"{cpu:10.1f} / {wall:9.1f}")
    calls = "/".join(f"{statistics.median(row.get(k, (0, 0, 0))[2] for row in results[f]):.2f}" for f in FORMS)
    print(f"{k:24s} " + " ".join(cells) + "   " + calls)
llm.shutdown()
