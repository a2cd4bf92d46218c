"""CPU (this machine): the engine thread's CPU in ``step_with_details`` a step, on host_paths.py's
engine (model and sampling stubbed, 256 requests of 300 tokens, async scheduling), with the landed
young-collection threshold against the interpreter's 700 (``AIOINFER_GC_YOUNG_THRESHOLD=0``),
alternating, 3 rounds.  PYTHONPATH=. python young_gc_cpu.py"""
import gc
import os
import statistics
import time

os.environ["ROUNDS"] = "0"
exec(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "host_paths.py")).read().replace("llm.shutdown()", ""))
step = engine.step_with_details
spent = [0.0, 0]


def timed(*a, **k):
    c = time.thread_time()
    try:
        return step(*a, **k)
    finally:
        spent[0] += time.thread_time() - c
        spent[1] += 1


engine.step_with_details = timed
young = [0]
gc.callbacks.append(lambda phase, info: young.__setitem__(0, young[0] + (phase == "start" and info["generation"] < 2)))
res = {}
for r in range(3):
    for form in ("interpreter", "landed"):
        if form == "interpreter":
            os.environ["AIOINFER_GC_YOUNG_THRESHOLD"] = "0"
        else:
            os.environ.pop("AIOINFER_GC_YOUNG_THRESHOLD", None)
        spent[:] = [0.0, 0]
        young[0] = 0
        go("free")
        res.setdefault(form, []).append(1e3 * spent[0] / spent[1])
        print(f"{form:>11}: step CPU {1e3 * spent[0] / spent[1]:.3f} ms, {spent[1]} steps, {young[0]} young collections",
              flush=True)
for form, v in res.items():
    print(form, "median %.3f ms a step" % statistics.median(v))
