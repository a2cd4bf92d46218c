"""A short table of a structured_output_rounds JSON: per form the ratio, tok/s, ms a step, engine
CPU, the sync wait (inside the CPU figure when the events spin), off-CPU (wall - CPU), the masks'
wait, the worker's fill and rejected tokens."""
import json
import statistics as st
import sys

for path in sys.argv[1:]:
    d = json.load(open(path))
    s = d["summary"]
    print(path.rsplit("/", 1)[-1], s["model"], "rounds", s["rounds"])
    print(f"{'form':>14} {'ratio':>6} {'tok/s':>8} {'ms/step':>7} {'cpu':>6} {'sync':>6} {'offcpu':>6} {'mwait':>6} {'fill':>6} {'rej':>4} {'compile':>7} {'gc':>6} {'gcfull':>6} {'n_full':>6}  ratios")
    for form in ["free"] + [k for k in s if isinstance(s[k], dict) and k != "free"]:
        runs = [r for r in d["runs"] if r["form"] == form]
        med = lambda key: st.median(r.get(key, 0.0) for r in runs)
        offcpu = st.median(r["ms_per_step"] - r["engine_cpu_ms_per_step"] for r in runs)
        v = s[form]
        ratio = f"{v['ratio_median']:.3f}" if "ratio_median" in v else "  -  "
        print(f"{form:>14} {ratio:>6} {med('tok_per_s'):8.0f} {med('ms_per_step'):7.3f} {med('engine_cpu_ms_per_step'):6.3f} "
              f"{med('sync_wait_ms_per_step'):6.3f} {offcpu:6.3f} {med('engine_wait_ms_per_step'):6.3f} {med('worker_ms_per_step'):6.3f} "
              f"{sum(r['rejected_tokens'] for r in runs):4d} {med('compile_ahead_ms_per_step'):7.3f} {med('gc_ms_per_step'):6.3f} "
              f"{med('gc_full_ms_per_step'):6.3f} {med('gc_full_count_ms_per_step'):6.2f}  {v.get('ratios', '')}")
