"""Fourteenth session, a probe (not a product form): where the constrained 0.5b step's extra time
goes. ``plumbing_only``: the deferred masks' engine-side path (plan, poll, copy, apply, sampling
after the masks) with no grammar work at all: no worker wakes, no matcher advances, the masks are a
cached all-allowed pinned buffer (so the pinned allocation is gone too). ``interval_20us`` /
``interval_200us``: the switch interval the engine thread runs at while the worker needs the GIL
(landed: 50 us)."""
import time

import torch

from aioinfer.worker import grammar_worker
from benchmarks import structured_output_rounds as rounds


def plumbing_only(engine):
    masks = engine.runner.grammar_masks
    allowed = torch.full((256, masks.num_words), -1, dtype=torch.int32, pin_memory=True)

    class DoneJob:
        live, rejected, started, finished = (), None, 0.0, 0.0

        def is_done(self):
            return True

        def wait(self):
            pass

    def start(pending, live=()):
        if pending is not None:
            pending.job = DoneJob()
            pending.job.finished = time.perf_counter()

    masks.start = start
    masks.advance = lambda live: None
    masks._compute = lambda pending: None  # a lockstep step's masks: left all allowed too
    masks._host_buffer = lambda num_rows, drafts: allowed[:num_rows]

    def undo():
        del masks.start, masks.advance, masks._compute, masks._host_buffer
    return undo


def interval(seconds):
    def variant(engine):
        saved = grammar_worker.HANDOFF.seconds
        grammar_worker.HANDOFF.seconds = seconds

        def undo():
            grammar_worker.HANDOFF.seconds = saved
        return undo
    return variant


rounds.VARIANTS.update(plumbing_only=plumbing_only, interval_20us=interval(20e-6), interval_200us=interval(200e-6))

if __name__ == "__main__":
    rounds.main()
