"""Seventeenth session: the sixteenth's diag16.py (its variants and GC counters) plus ``threads_1`` and
``host_wait`` (call 4 only: a step ahead sampled by the engine thread once the worker's masks are in,
as before the device waited for them; the device wait was not landed, ../device_wait.patch) and
``disjoint`` (the engine thread alone on the first CPU, the grammar worker and llguidance's threads on
the others).

Written after the last call, for the next session (not run here): ``--isolate CPU`` (the whole run,
free and constrained: the engine thread alone on CPU, every other thread of the process, the CUDA
driver's included, moved off it; ``disjoint`` pinned to CPU 0, where a VM's interrupts usually go,
and left the driver's threads there), ``zero_copy`` (the apply reads the slot's pinned host rows
itself: no copy, event or stream wait) and ``compute_copy`` (one torch copy on the compute stream,
behind the forward, instead of the copy stream's three driver calls)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../../s16/scripts"))
import diag16  # noqa: E402  (registers diag's and diag16's variants and counters)

from benchmarks import structured_output_rounds as rounds  # noqa: E402



def host_wait(engine):
    slots = engine.runner.grammar_masks._slots  # made by the warm-up runs
    saved = slots._driver
    slots._driver = None

    def undo():
        slots._driver = saved
    return undo


def disjoint(engine):
    masks = engine.runner.grammar_masks
    every = os.sched_getaffinity(0)
    mine = min(every)
    saved = masks._cpus

    def use(engine_cpus, grammar_cpus):
        if masks._worker is not None:  # made again with its new CPUs (its pool inherits them)
            masks._worker.close()
            masks._worker = None
        masks._cpus = grammar_cpus
        os.sched_setaffinity(0, engine_cpus)  # the calling thread: LLM.generate's engine thread
    use({mine}, every - {mine})
    return lambda: use(every, saved)


def _copies(device_rows):
    def variant(engine):
        slots = engine.runner.grammar_masks._slots  # made by the warm-up runs
        slots.start_copy = lambda slot, num_rows: None  # instance attributes over the methods
        slots.device_rows = lambda slot, num_rows: device_rows(slots, slot, num_rows)

        def undo():
            del slots.start_copy, slots.device_rows
        return undo
    return variant


zero_copy = _copies(lambda slots, slot, num_rows: slot.host[:num_rows])
compute_copy = _copies(lambda slots, slot, num_rows: slot.host[:num_rows].to(slots.device, non_blocking=True))

rounds.VARIANTS.update(threads_1=diag16.diag.threads(1), host_wait=host_wait, disjoint=disjoint,
                       zero_copy=zero_copy, compute_copy=compute_copy)


def isolate(cpu):
    """After the LLM is made: this (the engine) thread alone on ``cpu``, every other thread elsewhere."""
    import threading

    make = rounds.make_llm

    def make_llm(*args, **kwargs):
        made = make(*args, **kwargs)
        others = os.sched_getaffinity(0) - {cpu}
        me = threading.get_native_id()
        for tid in map(int, os.listdir("/proc/self/task")):
            if tid != me:
                try:
                    os.sched_setaffinity(tid, others)
                except OSError:
                    pass
        os.sched_setaffinity(0, {cpu})
        masks = made[0].engine.runner.grammar_masks
        masks._cpus = others  # the worker, made at the first constrained run, and its pool go there
        print(f"isolated: engine thread on CPU {cpu}, the rest on {sorted(others)}", flush=True)
        return made
    rounds.make_llm = make_llm

if __name__ == "__main__":
    if "--isolate" in sys.argv:
        at = sys.argv.index("--isolate")
        isolate(int(sys.argv[at + 1]))
        del sys.argv[at:at + 2]
    rounds.main()
