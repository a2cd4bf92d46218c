"""The collector held back while a batch of work runs (``full_collections_deferred``), and in the server.

A full collection traverses every object the collector tracks: after an engine has loaded, its
start-up heap (torch, transformers, the model, the tokenizer: ~440k objects for the 0.5b model).
On the H200 host one took 230-270 ms with the GIL held, about once a workload-1 run (1,041 steps):
0.21-0.26 ms a step, a tenth of the step (measured 2026-12-04). While the
batch runs, the oldest generation's threshold is raised out of reach, so the collector still
collects the young generations (what the batch itself makes and drops) but never the whole heap;
the thresholds are restored exactly afterwards, and the full collection the batch held back then
comes at the next young collection, outside the step loop. ``LLM.generate`` defers for the whole
call: deferring around its step loop only, the collection held back by one call came while the next
one tokenized its prompts (H200, 2026-12-04).

Young collections keep the process's threshold unless ``AIOINFER_GC_YOUNG_THRESHOLD`` says (then
both here and, for good, in the server: ``apply_young_threshold``). The interpreter's 700 starts one
whenever 700 more container objects are alive than at the last one, which a step over 256 requests
passes on its own transient lists; 20,000 was the default for a while, on CPU figures (the engine
thread's CPU a step 0.590 -> 0.513 ms with the model stubbed, 2-core CPU, 2026-12-05), until the
GPU hosts said otherwise (H100, 2026-12-05): the server ran at 16.5-18.4k tok/s with it against
21.0-21.8k with 700 (5 runs interleaved, its event loop 34-38 against 29-30 µs a token, its GPU
thread 25-26 against 22-23; docs/performance.md, "Other measured features"), and offline at 0.978
of 700 (6 rounds): collected less often, a step's garbage outgrows the caches before it is
walked. The knob stays for hosts where the balance differs.

Nothing changes in what is freed: reference counting frees as always, and cyclic garbage is
collected at the next young collection, or after the batch once it reached the oldest generation.
(``gc.freeze()``, which the server uses for its start-up heap, is not used here: it is process-wide
state an application may own, and the H200 image's interpreter already starts with a few hundred
objects frozen.)
"""

from __future__ import annotations

import contextlib
import gc
import os
import threading
from typing import Iterator

_lock = threading.Lock()
_holders = 0  # batches running with full collections deferred (threads may overlap)
_saved: tuple = ()  # the thresholds before the first of them

OUT_OF_REACH = 1 << 30  # young collections a full collection waits for: never, within a batch
# Net new container objects that start a young collection: 0 keeps the process's own (the
# interpreter's default: 700); ``AIOINFER_GC_YOUNG_THRESHOLD`` overrides it (benchmarks compare values).
YOUNG_THRESHOLD = 0


@contextlib.contextmanager
def full_collections_deferred() -> Iterator[None]:
    """No automatic full collection for the duration, and young ones at ``young_threshold()`` net
    allocations if that is higher than the process's (nested and concurrent uses share one deferral)."""
    global _holders, _saved
    with _lock:
        if _holders == 0:
            _saved = gc.get_threshold()
            gc.set_threshold(_young(_saved[0]), _saved[1], OUT_OF_REACH)
        _holders += 1
    try:
        yield
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0:
                gc.set_threshold(*_saved)


def apply_young_threshold() -> None:
    """For good, in a process that is ours (the server): young collections at ``young_threshold()``
    net allocations if that is higher than the process's (by default nothing changes)."""
    threshold = gc.get_threshold()
    gc.set_threshold(_young(threshold[0]), *threshold[1:])


def young_threshold() -> int:
    """``YOUNG_THRESHOLD``, or ``AIOINFER_GC_YOUNG_THRESHOLD`` when set (ValueError unless a whole
    number >= 0)."""
    text = os.environ.get("AIOINFER_GC_YOUNG_THRESHOLD")
    if text is None:
        return YOUNG_THRESHOLD
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"AIOINFER_GC_YOUNG_THRESHOLD must be a whole number >= 0, got {text!r}")
    return value


def _young(threshold: int) -> int:
    """The young generation's threshold to use instead of ``threshold`` (a higher one is kept; 0,
    which disables the collector, too)."""
    young = young_threshold()
    return threshold if threshold == 0 or young == 0 else max(threshold, young)
