"""Fifteenth session, a probe (not a product form): the constrained 0.5b step's true host work.

``--blocking``: every step's sync (``collect`` waiting for the sampled ids) is a blocking event, so
the engine thread's CPU is its real work, not a spin, and ``sync_wait`` is the time it waits for
the device; both forms (free and constrained) run so. Without it the events are the landed ones
(spinning) and only ``sync_wait`` is added. Wall - CPU - sync_wait - the masks' wait is then the
engine thread's time off the CPU for other reasons (the GIL).
``plumbing_only``: the deferred masks' engine-side path of this tree (plan into a slot, poll, copy,
apply, sampling after the masks) with no grammar work: no worker, no matcher advances.
``inline``: the real masks, computed on the engine thread as soon as the tokens before them are
collected (no worker thread: llguidance's threads run while the engine thread waits for them), so
the engine thread's CPU is its own Python on the real tokens with nothing running beside it.
``threads_N``: the landed path with llguidance on N threads (the landed default: 4 on the H200 host)."""
import os
import sys
import time

import torch

from aioinfer.worker import model_runner
from benchmarks import structured_output_rounds as rounds

SYNC = [0.0]
BLOCKING = "--blocking" in sys.argv
if BLOCKING:
    sys.argv.remove("--blocking")


class TimedEvent:
    __slots__ = ("event",)

    def __init__(self, event):
        self.event = event

    def synchronize(self):
        start = time.perf_counter()
        self.event.synchronize()
        SYNC[0] += time.perf_counter() - start


landed_copy_to_host = model_runner._copy_to_host


def copy_to_host(result):
    copied, ready = landed_copy_to_host(result)
    if ready is None:
        return copied, None
    if BLOCKING:
        ready = torch.cuda.Event(blocking=True)
        ready.record()
    return copied, TimedEvent(ready)


model_runner._copy_to_host = copy_to_host
rounds.COUNTERS["sync_wait"] = lambda: SYNC[0]


def plumbing_only(engine):
    masks = engine.runner.grammar_masks

    def start(pending, live=()):
        if pending is not None:
            pending.job = DoneJob()
            pending.job.started = pending.job.finished = time.perf_counter()

    masks.start = start
    masks.advance = lambda live: None
    masks._compute = lambda pending: None

    def undo():
        del masks.start, masks.advance, masks._compute
    return undo


class DoneJob:
    live, rejected, started, finished = (), None, 0.0, 0.0

    def is_done(self):
        return True

    def wait(self):
        pass


def inline(engine):
    masks = engine.runner.grammar_masks

    def start(pending, live=()):
        job = DoneJob()
        job.started = time.perf_counter()
        masks.advance(live)
        if pending is not None:
            masks._compute(pending)
            job.finished = time.perf_counter()
            pending.job = job

    masks.start = start

    def undo():
        del masks.start
    return undo


def threads(n):
    def variant(engine):
        masks = engine.runner.grammar_masks

        def use(value):
            if masks._worker is not None:
                masks._worker.close()
                masks._worker = None
            if value is None:
                os.environ.pop("AIOINFER_GRAMMAR_THREADS", None)
            else:
                os.environ["AIOINFER_GRAMMAR_THREADS"] = value
        saved = os.environ.get("AIOINFER_GRAMMAR_THREADS")
        use(str(n))
        return lambda: use(saved)
    return variant


rounds.VARIANTS.update(plumbing_only=plumbing_only, inline=inline, threads_2=threads(2), threads_4=threads(4),
                       threads_6=threads(6), threads_12=threads(12))

if __name__ == "__main__":
    rounds.main()
