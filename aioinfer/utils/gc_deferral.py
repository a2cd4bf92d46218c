"""The collector held back while a batch of work runs (``full_collections_deferred``), and in the server.

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

Young collections come less often too (``YOUNG_THRESHOLD``): the interpreter's default starts one
whenever 700 more container objects are alive than at the last one, and a step over 256 requests
passes that mark on its own transient lists, tuples and dicts, which reference counting frees a
moment later anyway: about one young collection a step, each walking what the step holds. At
20,000 they come only when the heap really grows: on a CPU, with the model and the sampling stubbed
out, 256 requests took 1-2 young collections in 305 steps instead of 309-315, and the engine
thread's CPU a step went from 0.590 to 0.513 ms (the twenty-fifth session, docs/performance.md).
The server, whose process is ours, keeps that threshold for good (``collect_young_less_often``,
beside its ``gc.freeze()``): with a small model computed on a CPU its event loop went from 40-42 to
35-36 µs a token. An embedded ``Engine`` leaves its application's collector alone.

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
# Net new container objects that start a young collection (the interpreter's default: 700).
# ``AIOINFER_GC_YOUNG_THRESHOLD`` overrides it; 0 keeps the process's own (benchmarks compare the two).
YOUNG_THRESHOLD = 20_000


@contextlib.contextmanager
def full_collections_deferred() -> Iterator[None]:
    """No automatic full collection for the duration, and young ones only every ``YOUNG_THRESHOLD``
    net allocations (nested and concurrent uses share one deferral)."""
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


def collect_young_less_often() -> None:
    """For good, in a process that is ours (the server): young collections every ``YOUNG_THRESHOLD``
    net allocations instead of the interpreter's 700."""
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
