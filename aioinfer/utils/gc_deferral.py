"""The collector's full collections held back while a batch of work runs (``full_collections_deferred``).

A full collection traverses every object the collector tracks: after an engine has loaded, its
start-up heap (torch, transformers, the model, the tokenizer: ~440k objects for the 0.5b model).
On the H200 host one took 230-270 ms with the GIL held, about once a workload-1 run (1,041 steps):
0.21-0.26 ms a step, a tenth of the step (the sixteenth session, docs/performance.md). While the
batch runs, the oldest generation's threshold is raised out of reach, so the collector still
collects the young generations (what the batch itself makes and drops) but never the whole heap;
the thresholds are restored exactly afterwards, and the full collection the batch held back then
comes at the next young collection, outside the step loop. ``LLM.generate`` defers for the whole
call: deferring around its step loop only, the collection held back by one call came while the next
one tokenized its prompts (the seventeenth session, on the H200).

Nothing changes in what is freed: reference counting frees as always, and cyclic garbage that
reached the oldest generation is collected after the batch. (``gc.freeze()``, which the server uses
for its start-up heap, is not used here: it is process-wide state an application may own, and the
H200 image's interpreter already starts with a few hundred objects frozen.)
"""

from __future__ import annotations

import contextlib
import gc
import threading
from typing import Iterator

_lock = threading.Lock()
_holders = 0  # batches running with full collections deferred (threads may overlap)
_saved: tuple = ()  # the thresholds before the first of them

OUT_OF_REACH = 1 << 30  # young collections a full collection waits for: never, within a batch


@contextlib.contextmanager
def full_collections_deferred() -> Iterator[None]:
    """No automatic full collection for the duration (nested and concurrent uses share one deferral)."""
    global _holders, _saved
    with _lock:
        if _holders == 0:
            _saved = gc.get_threshold()
            gc.set_threshold(_saved[0], _saved[1], OUT_OF_REACH)
        _holders += 1
    try:
        yield
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0:
                gc.set_threshold(*_saved)
