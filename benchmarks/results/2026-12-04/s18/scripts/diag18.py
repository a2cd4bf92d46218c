"""Eighteenth session: diag17.py's variants and counters (its ``--isolate``) on the tree where the
apply reads the slots' pinned host rows, plus ``copy`` (the slots made again with a copy to device
rows, the seventeenth session's path: the A/B of the change in one engine) and ``apart`` (the engine
thread on CPU 15, the grammar worker and llguidance's threads on every CPU but 15 and the CPU whose
spinning slowed CPU 15 most in siblings.py's probe, ``SIBLINGS=FILE.json``) and ``engine_consume`` (the engine thread advances the matchers itself,
the worker computes only the masks); ``jit_launch`` (the apply launched through Triton's JIT every
step, as before utils/triton_launch.py)."""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../../s17/scripts"))
import diag17  # noqa: E402  (registers its variants, diag16's and diag's, and their counters)

from aioinfer.worker.mask_slots import MaskSlots  # noqa: E402
from benchmarks import structured_output_rounds as rounds  # noqa: E402


def copy(engine):
    masks = engine.runner.grammar_masks
    saved = masks._slots  # made by the warm-up runs
    masks._slots = MaskSlots(masks.num_words, masks.device, saved.rows, read_host_rows=False)
    assert saved.reads_host_rows and not masks._slots.reads_host_rows

    def undo():
        masks._slots.close()
        masks._slots = saved
    return undo


def apart(engine):
    pairs = json.load(open(os.environ["SIBLINGS"]))["pairs"]
    every = os.sched_getaffinity(0)
    mine = 15 if 15 in every else max(every)
    partner = max((pairs[f"{mine},{o}"], o) for o in every if o != mine)[1]
    masks = engine.runner.grammar_masks
    saved = masks._cpus

    def use(engine_cpus, grammar_cpus):
        if masks._worker is not None:  # made again with its new CPUs (its pool inherits them)
            masks._worker.close()
            masks._worker = None
        masks._cpus = grammar_cpus
        os.sched_setaffinity(0, engine_cpus)
    use({mine}, every - {mine, partner})
    return lambda: use(every, saved)


def engine_consume(engine):
    """The matchers take the collected tokens on the engine thread (one ``consume_token_par``, the GIL
    dropped while it runs), the worker computing only the masks: one GIL turn a step fewer."""
    from aioinfer.worker.grammar_mask import GrammarMasks
    masks = engine.runner.grammar_masks

    def start(pending, live=()):
        masks._consume(list(live))
        GrammarMasks.start(masks, pending, ())
    masks.start = start

    def undo():
        del masks.start
    return undo


class _NoneKept(dict):
    """A kernel cache that keeps nothing: every launch through Triton's JIT, as before CompiledLaunch."""

    def __setitem__(self, key, value):
        pass


def jit_launch(engine):
    """The apply launched through Triton's JIT every step (the tree before utils/triton_launch.py)."""
    from aioinfer.worker import bitmask_apply
    launch = bitmask_apply._get_kernel()
    saved = launch._compiled
    launch._compiled = _NoneKept()

    def undo():
        launch._compiled = saved
    return undo


rounds.VARIANTS.update(copy=copy, apart=apart, engine_consume=engine_consume, jit_launch=jit_launch)

def phases():
    """The engine thread's CPU in each phase (thread_time around the methods, a few µs a call), as
    COUNTERS: whether the phases that do no grammar work also cost more in a constrained run."""
    import time

    from aioinfer.core.scheduler import Scheduler
    from aioinfer.engine.output_processor import OutputProcessor
    from aioinfer.worker.grammar_mask import GrammarMasks
    from aioinfer.worker.model_runner import ModelRunner
    for cls, name in ((Scheduler, "schedule"), (Scheduler, "update"), (ModelRunner, "prepare"),
                      (ModelRunner, "run"), (ModelRunner, "finish"), (ModelRunner, "collect"),
                      (GrammarMasks, "apply"), (OutputProcessor, "process")):
        total = [0.0]
        fn = getattr(cls, name)

        def timed(*args, _fn=fn, _total=total, **kwargs):
            c = time.thread_time()
            try:
                return _fn(*args, **kwargs)
            finally:
                _total[0] += time.thread_time() - c
        setattr(cls, name, timed)
        rounds.COUNTERS[f"ph_{name}"] = lambda _total=total: _total[0]


if __name__ == "__main__":
    if "--phases" in sys.argv:
        sys.argv.remove("--phases")
        phases()
    if "--isolate" in sys.argv:
        at = sys.argv.index("--isolate")
        diag17.isolate(int(sys.argv[at + 1]))
        del sys.argv[at:at + 2]
    rounds.main()
