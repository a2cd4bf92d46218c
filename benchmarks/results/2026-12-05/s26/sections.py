"""Per-section engine-thread CPU (thread_time_ns) of steady decode steps, free vs nogw, stubbed engine."""
import os, statistics, time, collections
os.environ["ROUNDS"] = "0"
exec(open("benchmarks/results/2026-12-05/s25/scripts/host_paths.py").read().replace("llm.shutdown()", ""))
from aioinfer.engine import engine_core as ec
T = time.thread_time_ns
acc = collections.defaultdict(list)
def step_with_details(self):
    marks = [("start", T())]
    m = lambda name: marks.append((name, T()))
    lockstep = self._in_flight is None
    if lockstep:
        scheduler_output = self.scheduler.schedule()
        launched = self.runner.launch(scheduler_output)
    else:
        scheduler_output, launched = self._in_flight
        self._in_flight = None
    ahead = None
    if self.async_scheduling and not scheduler_output.is_empty and self._can_schedule_ahead(scheduler_output):
        ahead = self.scheduler.schedule()
        if ahead.is_empty and not ahead.finished_request_ids and not ahead.has_swaps:
            ahead = None
    m("schedule")
    masks_of = None
    if ahead is not None and self._grammars_alive():
        if self._deferred and self.runner.poll_masks(launched):
            self._finish_deferred(launched)
        m("poll1")
        prepared = self.runner.prepare(ahead)
        m("prepare")
        self._finish_deferred(launched)
        m("finish")
        masks_of = self.runner.run(prepared, defer_masks=True)
        self._in_flight, self._deferred = (ahead, masks_of), True
        m("run")
    else:
        self._finish_deferred(launched)
        if ahead is not None:
            prepared = self.runner.prepare(ahead)
            m("prepare")
            self._in_flight = (ahead, self.runner.run(prepared))
            m("run")
    runner_output = (self.runner.collect(launched) if masks_of is None
                     else self.runner.collect(launched, masks_of=masks_of))
    m("collect")
    self.num_steps += 1
    outputs = self.scheduler.update(scheduler_output, runner_output)
    m("update")
    if masks_of is not None and self.runner.poll_masks(masks_of):
        self._finish_deferred(masks_of)
    m("poll2")
    so = scheduler_output
    if len(so.scheduled) == 256 and so.num_scheduled_tokens == 256 and not so.new_requests:
        for (a, t0), (b, t1) in zip(marks, marks[1:]):
            acc[b].append(t1 - t0)
        acc["total"].append(marks[-1][1] - marks[0][1])
    return scheduler_output, runner_output, outputs
ec.EngineCore.step_with_details = step_with_details
def go2(form):
    acc.clear()
    params = [SamplingParams(max_tokens=OUT, ignore_eos=True, temperature=0.0,
                             structured_outputs=constraint if form != "free" else None) for r in reqs]
    undo = rounds.VARIANTS["no_grammar_work"](engine) if form == "nogw" else (lambda: None)
    llm.generate([r.prompt for r in reqs], params, use_tqdm=False, cache_salt=fresh_cache_salt())
    undo()
    return {k: statistics.median(v) / 1e3 for k, v in acc.items()}
FORMS = os.environ.get("FORMS", "free,nogw").split(",")
for f in FORMS: go2(f)
res = {f: [] for f in FORMS}
for r in range(int(os.environ.get("R", 5))):
    for f in FORMS:
        res[f].append(go2(f))
names = ["schedule", "poll1", "prepare", "finish", "run", "collect", "update", "poll2", "total"]
print("section    " + " ".join(f"{f:>8s}" for f in FORMS))
for n in names:
    print(f"{n:10s} " + " ".join(f"{statistics.median(x.get(n, 0) for x in res[f]):8.1f}" for f in FORMS))
