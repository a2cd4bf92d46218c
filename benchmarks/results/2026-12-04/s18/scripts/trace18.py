"""Eighteenth session: where a constrained 0.5b step's time goes, as a timeline. Every engine-thread
phase of every step is stamped (perf_counter: schedule, the polls, prepare, finish, run, collect and
its sync, update, the LLM's output processing and metrics), and so is the grammar worker's job (the
engine's submit, the worker holding the GIL after its queue, after consume, after the masks).
Per run: the median of each phase a step, the engine thread's context switches a step
(/proc/thread-self/status), and for constrained runs the worker's intervals. Run through the rounds
harness (``diag18.py``'s variants too), with ``TRACE=FILE.json`` for the per-run summaries.

Variants added here: ``finish_first`` (a step ahead is always sampled before the next one is prepared,
waiting for its masks if need be, so that its sampling runs on the device while the host prepares:
no sync wait at collect) and ``threads_8``.
"""
import json
import os
import queue
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
import diag18  # noqa: E402,F401  (the variants and counters of s15-s18)

from aioinfer.core.scheduler import Scheduler  # noqa: E402
from aioinfer.engine import engine_core  # noqa: E402
from aioinfer.engine.output_processor import OutputProcessor  # noqa: E402
from aioinfer.entrypoints import llm as llm_module  # noqa: E402
from aioinfer.entrypoints.llm_metrics import OfflineMetrics  # noqa: E402
from aioinfer.worker import grammar_worker, model_runner  # noqa: E402
from aioinfer.worker.grammar_mask import GrammarMasks  # noqa: E402
from benchmarks import structured_output_rounds as rounds  # noqa: E402

clock = time.perf_counter
EV: list = []  # (name, t) engine thread and worker
ADD = EV.append


def stamp(cls, name, label=None):
    fn = getattr(cls, name)
    label = label or name

    def wrapped(*args, **kwargs):
        ADD((label + "<", clock()))
        try:
            return fn(*args, **kwargs)
        finally:
            ADD((label + ">", clock()))
    setattr(cls, name, wrapped)


for cls, name in ((engine_core.EngineCore, "step_with_details"), (Scheduler, "schedule"), (Scheduler, "update"),
                  (model_runner.ModelRunner, "prepare"), (model_runner.ModelRunner, "run"),
                  (model_runner.ModelRunner, "finish"), (model_runner.ModelRunner, "collect"),
                  (OutputProcessor, "process"), (GrammarMasks, "apply"), (GrammarMasks, "start")):
    stamp(cls, name)
if hasattr(OfflineMetrics, "record_step"):
    stamp(OfflineMetrics, "record_step", "metrics")

_poll = model_runner.ModelRunner.poll_masks


def poll_masks(self, launched):
    found = _poll(self, launched)
    ADD(("poll+" if found else "poll-", clock()))
    return found


model_runner.ModelRunner.poll_masks = poll_masks

# The sync inside collect: diag.py (s15) wraps the step's ready event in TimedEvent; stamp around it.
_timed_sync = sys.modules["diag"].TimedEvent.synchronize


def timed_sync(self):
    ADD(("sync<", clock()))
    _timed_sync(self)
    ADD(("sync>", clock()))


sys.modules["diag"].TimedEvent.synchronize = timed_sync


def _serve(jobs, threads, cpus, handoff, ready, made):
    """grammar_worker._serve with stamps: after the queue (the GIL held), after consume, after the masks."""
    try:
        if cpus and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, cpus)
        import llguidance
        executor = llguidance.LLExecutor(threads)
    except BaseException as error:
        made.append(error)
        ready.set()
        return
    made.append(executor)
    ready.set()
    consume, masks = executor.consume_token_par, executor.unsafe_compute_mask_ptr
    while (job := jobs.get()) is not None:
        ADD(("w_got", clock()))
        job.started = clock()
        try:
            if job.live:
                accepted = consume(job.live)
                ADD(("w_consumed", clock()))
                if not all(accepted):
                    job.rejected = accepted
            if job.plain:
                masks(job.plain, job.ptr, job.row_bytes, job.num_rows)
                ADD(("w_masked", clock()))
            if job.with_drafts:
                executor.unsafe_compute_mask_ptr_with_draft_token(job.with_drafts, job.ptr, job.row_bytes, job.num_rows)
        except BaseException as error:
            job.error = error
        finally:
            handoff.exit()
            job.finished = clock()
            job.done.release()


grammar_worker._serve = _serve

_ctx = {}


def ctx_switches():
    try:
        with open("/proc/thread-self/status") as f:
            got = {}
            for line in f:
                if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                    key, value = line.split(":")
                    got[key] = int(value)
            return got.get("voluntary_ctxt_switches", 0), got.get("nonvoluntary_ctxt_switches", 0)
    except OSError:
        return 0, 0


RAW: list = []  # per generate call: (events, context switches before, after); summarized at the end
_generate = llm_module.LLM.generate


def generate(self, *args, **kwargs):
    global EV, ADD
    EV = []  # a fresh list, kept: summarizing inside the benchmark's timed call would count in it
    ADD = EV.append
    before = ctx_switches()
    out = _generate(self, *args, **kwargs)
    RAW.append((EV, before, ctx_switches()))
    return out


def summaries():
    out = []
    for events, before, after in RAW:
        steps = sum(1 for name, _ in events if name == "step_with_details<")
        summary = summarize(events)
        summary["vol_ctx_per_step"] = (after[0] - before[0]) / max(1, steps)
        summary["invol_ctx_per_step"] = (after[1] - before[1]) / max(1, steps)
        summary["constrained"] = any(name == "w_got" for name, _ in events)
        out.append(summary)
    return out


llm_module.LLM.generate = generate


def summarize(events):
    """Per step (from one step_with_details< to the next): the time in each phase and between them."""
    steps, cur = [], None
    for name, t in events:
        if name == "step_with_details<":
            if cur is not None:
                cur.append(("next<", t))
                steps.append(cur)
            cur = [(name, t)]
        elif cur is not None:
            cur.append((name, t))
    per = {}

    def add(key, value):
        per.setdefault(key, []).append(value)

    for step in steps:
        t0 = step[0][1]
        first = {}
        last = {}
        for name, t in step:
            first.setdefault(name, t)
            last[name] = t
        for phase in ("schedule", "prepare", "run", "finish", "collect", "update", "process", "metrics", "apply", "sync", "start"):
            if phase + "<" in first and phase + ">" in last:
                # sum of every occurrence
                total, open_at = 0.0, None
                for name, t in step:
                    if name == phase + "<":
                        open_at = t
                    elif name == phase + ">" and open_at is not None:
                        total += t - open_at
                        open_at = None
                add(phase, total)
        add("step", step[-1][1] - t0)
        add("core", last.get("step_with_details>", t0) - t0)
        # where the step ahead was sampled: the first finish> offset
        if "finish>" in first:
            add("finish_at", first["finish>"] - t0)
        if "collect>" in last:
            add("collect_at", first.get("collect<", t0) - t0)
        n_hit = sum(1 for name, _ in step if name == "poll+")
        n_miss = sum(1 for name, _ in step if name == "poll-")
        add("polls_hit", n_hit)
        add("polls_missed", n_miss)
        # the worker: from the engine's submit (start<) to its stamps
        if "start<" in first and "w_got" in first:
            s = first["start<"]
            add("w_wake", first["w_got"] - s)
            if "w_consumed" in first:
                add("w_consume", first["w_consumed"] - first["w_got"])
                if "w_masked" in first:
                    add("w_masks", first["w_masked"] - first["w_consumed"])
            if "w_masked" in first:
                add("w_ready_after_submit", first["w_masked"] - s)
    # the worker's stamps fall in the step that submitted the job or the next: pair them by order
    submits = [t for name, t in events if name == "start<"]
    got = [t for name, t in events if name == "w_got"]
    consumed = [t for name, t in events if name == "w_consumed"]
    masked = [t for name, t in events if name == "w_masked"]
    finishes = [t for name, t in events if name == "finish<"]
    pair = {}
    if submits and len(submits) == len(got) == len(masked):
        pair["w_wake"] = [g - s for s, g in zip(submits, got)]
        if len(consumed) == len(got):
            pair["w_consume"] = [c - g for g, c in zip(got, consumed)]
            pair["w_masks"] = [m - c for c, m in zip(consumed, masked)]
        pair["w_submit_to_masked"] = [m - s for s, m in zip(submits, masked)]
    out = {k: 1e3 * statistics.median(v) if not k.startswith("polls") else statistics.mean(v)
           for k, v in per.items() if v}
    out.update({k + "_paired": 1e3 * statistics.median(v) for k, v in pair.items() if v})
    out["n_steps"] = len(steps)
    return out


def finish_first(engine):
    """The step ahead sampled before the next is prepared (its masks waited for if need be)."""
    runner = engine.runner

    def poll(launched):
        if engine._in_flight is None or engine._in_flight[1] is not launched:
            return True  # the poll before prepare: say computed, so that it is sampled now
        return poll_masks(runner, launched)
    runner.poll_masks = poll

    def undo():
        del runner.poll_masks
    return undo


rounds.VARIANTS.update(finish_first=finish_first, threads_8=sys.modules["diag"].threads(8))


if __name__ == "__main__":
    out = os.environ.get("TRACE")
    try:
        diag_main = sys.modules["diag18"]
        if "--phases" in sys.argv:
            sys.argv.remove("--phases")
            diag_main.phases()
        rounds.main()
    finally:
        SUMMARIES = summaries()
        if out:
            with open(out, "w") as f:
                json.dump(SUMMARIES, f, indent=1)
        keys = ["step", "core", "schedule", "prepare", "run", "finish", "apply", "collect", "sync", "update",
                "process", "metrics", "finish_at", "collect_at", "polls_hit", "polls_missed",
                "w_wake_paired", "w_consume_paired", "w_masks_paired", "w_submit_to_masked_paired",
                "vol_ctx_per_step", "invol_ctx_per_step"]
        timed = SUMMARIES[4:]  # 2 warm-ups and 2 untimed full-size runs first
        print("trace medians over runs (ms a step; polls and ctx switches: counts a step)")
        for constrained in (False, True):
            runs = [s for s in timed if s.get("constrained") == constrained]
            if runs:
                print(("constrained" if constrained else "free") + f" ({len(runs)} runs): " + "  ".join(
                    f"{k} {statistics.median(r[k] for r in runs if k in r):.3f}" for k in keys
                    if any(k in r for r in runs)))
