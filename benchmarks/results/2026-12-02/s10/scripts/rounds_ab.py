"""structured_output_rounds with the ninth session's handoff (worker signals an Event once inside
llguidance; the engine thread waits for it) as the variant "event_handoff"."""
import threading
from concurrent.futures import ThreadPoolExecutor
import time

from benchmarks import structured_output_rounds as rounds
from aioinfer.worker import grammar_mask
from aioinfer.worker.grammar_mask import GrammarMasks, _live


def old_start(self, pending, advances=()):
    if pending is None:
        self.advance(advances)
        return
    self._llg_executor()
    if self._thread is None:
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="aioinfer-grammar")
    inside = threading.Event()
    pending.future = self._thread.submit(old_compute, self, pending, inside, _live(advances))
    inside.wait()


def old_compute(self, pending, inside=None, live=()):
    started = time.perf_counter()
    host = pending.host
    row_bytes, num_rows = self.num_words * 4, host.shape[0]
    try:
        if inside is not None:
            inside.set()
        self._consume(live)
        if pending.plain:
            self._executor.unsafe_compute_mask_ptr(pending.plain, host.data_ptr(), row_bytes, num_rows)
        if pending.with_drafts:
            self._executor.unsafe_compute_mask_ptr_with_draft_token(pending.with_drafts, host.data_ptr(),
                                                                    row_bytes, num_rows)
    finally:
        if inside is not None:
            inside.set()
    self.fill_seconds += time.perf_counter() - started
    self.num_fills += 1


def event_handoff(engine):
    new = GrammarMasks.start
    GrammarMasks.start = old_start
    def undo():
        GrammarMasks.start = new
    return undo


def interval_200us(engine):
    saved = grammar_mask._HANDOFF.seconds
    grammar_mask._HANDOFF.seconds = 200e-6
    def undo():
        grammar_mask._HANDOFF.seconds = saved
    return undo


rounds.VARIANTS["event_handoff"] = event_handoff
rounds.VARIANTS["interval_200us"] = interval_200us

if __name__ == "__main__":
    rounds.main()
