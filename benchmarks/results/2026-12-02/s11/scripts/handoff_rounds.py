"""Call 2 variants: the tenth session's handoff (switch interval back before the masks, so that their
copy starts when the engine thread next gives up the GIL), a 20 µs interval, and 8 llguidance threads."""
import time

import llguidance

from aioinfer.worker import grammar_mask
from aioinfer.worker.grammar_mask import GrammarMasks
from benchmarks import structured_output_rounds as rounds


def _compute_s10(self, pending, live=(), handoff=False):
    started = time.perf_counter()
    host = pending.host
    row_bytes, num_rows = self.num_words * 4, host.shape[0]
    try:
        self._consume(live)
    finally:
        if handoff:
            grammar_mask._HANDOFF.exit()
    if pending.plain:
        self._executor.unsafe_compute_mask_ptr(pending.plain, host.data_ptr(), row_bytes, num_rows)
    filled = time.perf_counter()
    if self.device.type == "cuda":
        self._copy_to_device(pending)
    done = time.perf_counter()
    self.fill_seconds += done - started
    self.copy_start_seconds += done - filled
    self.num_fills += 1


def handoff_s10(engine):
    new = GrammarMasks._compute
    GrammarMasks._compute = _compute_s10

    def undo():
        GrammarMasks._compute = new
    return undo


def handoff20(engine):
    saved = grammar_mask._HANDOFF.seconds
    grammar_mask._HANDOFF.seconds = 20e-6

    def undo():
        grammar_mask._HANDOFF.seconds = saved
    return undo


def threads8(engine):
    masks = engine.runner.grammar_masks
    saved = masks._executor
    masks._executor = llguidance.LLExecutor(8)

    def undo():
        masks._executor = saved
    return undo


rounds.VARIANTS.update(handoff_s10=handoff_s10, handoff20=handoff20, threads8=threads8)

if __name__ == "__main__":
    rounds.main()
