"""Sixteenth session: the fifteenth's diag.py variants plus ``no_metadata_cache`` (the constrained
run with SamplingMetadata built fresh every step, as before 894271b's cache), ``threads_3``, the
COUNTERS compile_ahead (wall), gc and gc_full (wall in the collector) and gc_full_count (full
collections per 1000 steps), and ``--freeze`` (gc.collect(); gc.freeze() once the LLM is made)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../../../2026-12-03/s15/scripts"))
import diag  # noqa: E402  (registers its variants and the sync timer)

from aioinfer.worker.sampling_metadata import SamplingMetadata  # noqa: E402
from benchmarks import structured_output_rounds as rounds  # noqa: E402


class FreshBuilds:
    @staticmethod
    def build(rows, vocab, device, row_offsets=None):
        return SamplingMetadata.build(rows, vocab, device, row_offsets=row_offsets)


def no_metadata_cache(engine):
    runner = engine.runner
    saved = runner._sampling_metadata
    runner._sampling_metadata = FreshBuilds()

    def undo():
        runner._sampling_metadata = saved
    return undo


# The wall time each run spends building its requests' matchers (inside its timed region), and in
# the garbage collector (any thread), as COUNTERS.
import gc  # noqa: E402
import time  # noqa: E402

from aioinfer.engine.input_processor import InputProcessor  # noqa: E402

SPENT = {"compile_ahead": 0.0, "gc": 0.0, "gc_full": 0.0, "gc_full_count": 0.0}
_compile_ahead = InputProcessor.compile_ahead


def compile_ahead(self, constraints):
    start = time.perf_counter()
    try:
        return _compile_ahead(self, constraints)
    finally:
        SPENT["compile_ahead"] += time.perf_counter() - start


InputProcessor.compile_ahead = compile_ahead
_gc_start = [0.0]


def _gc_callback(phase, info):
    if phase == "start":
        _gc_start[0] = time.perf_counter()
    else:
        spent = time.perf_counter() - _gc_start[0]
        SPENT["gc"] += spent
        if info["generation"] == 2:
            SPENT["gc_full"] += spent
            SPENT["gc_full_count"] += 1.0  # reported as 1e3 x count / steps: full collections per 1000 steps


gc.callbacks.append(_gc_callback)
for _name in SPENT:
    rounds.COUNTERS[_name] = (lambda name=_name: SPENT[name])

rounds.VARIANTS.update(no_metadata_cache=no_metadata_cache, threads_3=diag.threads(3))

if __name__ == "__main__":
    if "--freeze" in sys.argv:  # the start-up heap out of the collector's sight once the engine is up
        sys.argv.remove("--freeze")
        _make_llm = rounds.make_llm

        def make_llm(*args, **kwargs):
            made = _make_llm(*args, **kwargs)
            gc.collect()
            gc.freeze()
            print("frozen", gc.get_freeze_count(), "objects", flush=True)
            return made
        rounds.make_llm = make_llm
    rounds.main()
