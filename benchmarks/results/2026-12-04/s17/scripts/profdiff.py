"""Where the constrained step's extra engine-thread time goes: workload 1 free and constrained, each
run under cProfile (the engine thread is the caller's), per-function own time a step, constrained
minus free, largest first. The profiler inflates every call alike, so differences, not totals, are
the figures; the stats are dumped for later reading.

    python profdiff.py --tokenizer .ab/tok --pairs 2 --out DIR
"""
import argparse
import cProfile
import os
import pstats
import tempfile
import time

from aioinfer import SamplingParams
from aioinfer.structured_output import StructuredOutputsParams
from benchmarks.common import SHAPES, fresh_cache_salt, make_llm, workload1, write_dummy_model
from benchmarks.offline_throughput import STRUCTURED_SCHEMAS


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--pairs", type=int, default=2)
    p.add_argument("--out", required=True)
    p.add_argument("--top", type=int, default=45)
    p.add_argument("--device", default="cuda")
    p.add_argument("--num-requests", type=int, default=256)
    p.add_argument("--max-tokens", type=int, default=None, help="a cap (a CPU smoke test only)")
    args = p.parse_args()
    shape = SHAPES["qwen2.5-0.5b"]
    folder = write_dummy_model(shape, tempfile.mkdtemp())
    llm, _ = make_llm(str(folder), args.device, None, None, max_model_len=2048, max_num_seqs=256,
                      max_num_batched_tokens=8192, gpu_memory_utilization=0.9, tokenizer=args.tokenizer)
    engine = llm.engine
    constraint = StructuredOutputsParams(json=STRUCTURED_SCHEMAS["strings"])
    requests = workload1(max_token_id=10000)[:args.num_requests]
    if args.max_tokens:
        requests = [type(r)(r.prompt[:64], min(r.max_tokens, args.max_tokens)) for r in requests]

    def run(constrained, profile):
        params = [SamplingParams(max_tokens=r.max_tokens, ignore_eos=True, temperature=0.0,
                                 structured_outputs=constraint if constrained else None) for r in requests]
        steps = engine.num_steps
        prof = cProfile.Profile() if profile else None
        start = time.perf_counter()
        if prof:
            prof.enable()
        llm.generate([r.prompt for r in requests], params, use_tqdm=False, cache_salt=fresh_cache_salt())
        if prof:
            prof.disable()
        seconds = time.perf_counter() - start
        steps = engine.num_steps - steps
        print(f"{'constrained' if constrained else 'free':>11} profiled={profile} {1e3 * seconds / steps:.3f} ms/step", flush=True)
        return prof, steps

    run(False, False), run(True, False)
    own = {False: {}, True: {}}
    for i in range(args.pairs):
        for constrained in (False, True):
            prof, steps = run(constrained, True)
            path = os.path.join(args.out, f"{'json' if constrained else 'free'}_{i}.pstats")
            prof.dump_stats(path)
            stats = pstats.Stats(path).stats
            for func, (cc, nc, tt, ct, callers) in stats.items():
                row = own[constrained].setdefault(func, [0.0, 0])
                row[0] += tt / steps / args.pairs
                row[1] += nc / steps / args.pairs
    funcs = set(own[False]) | set(own[True])
    rows = []
    for f in funcs:
        a, b = own[False].get(f, [0.0, 0]), own[True].get(f, [0.0, 0])
        rows.append((b[0] - a[0], a[0], b[0], a[1], b[1], f))
    rows.sort(key=lambda r: -abs(r[0]))
    total = (sum(r[1] for r in rows), sum(r[2] for r in rows))
    print(f"own time a step under the profiler: free {1e3 * total[0]:.3f} ms, constrained {1e3 * total[1]:.3f} ms")
    print(f"{'diff us':>8} {'free us':>8} {'json us':>8} {'calls f':>8} {'calls j':>8}  function")
    for d, a, b, na, nb, (fn, line, name) in rows[:args.top]:
        print(f"{1e6 * d:8.1f} {1e6 * a:8.1f} {1e6 * b:8.1f} {na:8.1f} {nb:8.1f}  {os.path.basename(fn)}:{line}({name})")
    llm.shutdown()


if __name__ == "__main__":
    main()
