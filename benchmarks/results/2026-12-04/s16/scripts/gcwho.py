"""Sixteenth session, a probe: what the collector's full collections traverse during workload 1
(0.5b dummy, free): at each full collection's start, the freeze count, the tracked objects it will
see (gc.get_objects()) by type, and its duration."""
import collections
import gc
import sys
import tempfile
import time

from aioinfer import SamplingParams
from benchmarks.common import SHAPES, fresh_cache_salt, make_llm, workload1, write_dummy_model

shape = SHAPES["qwen2.5-0.5b"]
llm, _ = make_llm(str(write_dummy_model(shape, tempfile.mkdtemp())), "cuda", None, None, max_model_len=2048,
                  max_num_seqs=256, max_num_batched_tokens=8192, gpu_memory_utilization=0.9, tokenizer=sys.argv[1])
engine = llm.engine
state = {"t": 0.0, "seen": None}


def callback(phase, info):
    if info["generation"] != 2:
        return
    if phase == "start":
        objects = gc.get_objects()
        state["seen"] = (gc.get_freeze_count(), len(objects), collections.Counter(type(o).__name__ for o in objects).most_common(8))
        del objects
        state["t"] = time.perf_counter()
    else:
        print(f"full collection at step {engine.num_steps}: {1e3 * (time.perf_counter() - state['t']):.1f} ms, "
              f"frozen {state['seen'][0]}, tracked {state['seen'][1]}: {state['seen'][2]}, collected {info['collected']}", flush=True)


gc.callbacks.append(callback)
requests = workload1(max_token_id=10000)
print("before runs: frozen", gc.get_freeze_count(), "tracked", len(gc.get_objects()), "counts", gc.get_count(), flush=True)
for run in range(4):
    params = [SamplingParams(max_tokens=r.max_tokens, ignore_eos=True, temperature=0.0) for r in requests]
    start, steps = time.perf_counter(), engine.num_steps
    outs = llm.generate([r.prompt for r in requests], params, use_tqdm=False, cache_salt=fresh_cache_salt())
    print(f"run {run}: {time.perf_counter() - start:.2f} s, {engine.num_steps - steps} steps; after: frozen "
          f"{gc.get_freeze_count()} tracked {len(gc.get_objects())}", flush=True)
t = time.perf_counter()
gc.collect()
print(f"explicit full collection after the runs: {1e3 * (time.perf_counter() - t):.1f} ms")
llm.shutdown()
