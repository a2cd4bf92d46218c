"""Thirteenth session: the lean grammar worker (this tree) against the one landed at 280aae6 (``legacy``:
the worker starts the masks' copy itself, through a ThreadPoolExecutor), in one engine, by
benchmarks/structured_output_rounds.py's alternating rounds. ``constrained`` is this tree's path."""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import legacy_grammar_mask  # noqa: E402

from aioinfer.worker import grammar_worker  # noqa: E402
from benchmarks import structured_output_rounds as rounds  # noqa: E402


def legacy(engine):
    runner = engine.runner
    mine = runner.grammar_masks
    runner.grammar_masks = legacy_grammar_mask.GrammarMasks(mine.vocab_size, mine.device)

    def undo():
        runner.grammar_masks = mine
    return undo


def long_interval(engine):  # this tree without the short switch interval while the worker needs the GIL
    saved = grammar_worker.HANDOFF.seconds
    grammar_worker.HANDOFF.seconds = sys.getswitchinterval()

    def undo():
        grammar_worker.HANDOFF.seconds = saved
    return undo


def consume_inline(engine):  # the matchers take the tokens on the engine thread: one handoff less a step
    masks = engine.runner.grammar_masks
    real_start = type(masks).start

    def start(self, pending, live=()):
        if pending is not None and live:
            self.advance(live)
            live = ()
        real_start(self, pending, live)
    masks.start = start.__get__(masks)

    def undo():
        del masks.start
    return undo


def no_poll(engine):  # the copy started at sampling only
    masks = engine.runner.grammar_masks
    masks.poll = lambda pending: None

    def undo():
        del masks.poll
    return undo


def apply_torch(engine):  # the masks applied by three torch ops instead of one Triton launch
    from aioinfer.worker import bitmask_apply, grammar_mask

    grammar_mask.apply_bitmask = bitmask_apply.apply_bitmask_torch

    def undo():
        grammar_mask.apply_bitmask = bitmask_apply.apply_bitmask
    return undo


def no_ring(engine):  # a fresh pinned and device buffer a step, as before the ring
    masks = engine.runner.grammar_masks
    pinned = masks.device.type == "cuda"

    def host_buffer(num_rows, drafts):
        if drafts is not None:
            return torch.full((num_rows, masks.num_words), -1, dtype=torch.int32, pin_memory=pinned)
        return torch.empty((num_rows, masks.num_words), dtype=torch.int32, pin_memory=pinned)
    masks._host_buffer = host_buffer
    masks._device_buffer = lambda host: torch.empty(host.shape, dtype=torch.int32, device=masks.device)

    def undo():
        del masks._host_buffer, masks._device_buffer
    return undo


rounds.VARIANTS.update(legacy=legacy, long_interval=long_interval, consume_inline=consume_inline, no_poll=no_poll,
                       apply_torch=apply_torch, no_ring=no_ring)

if __name__ == "__main__":
    rounds.main()
