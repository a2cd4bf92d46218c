"""CPU: host_paths.py's free and no-grammar-work runs under cProfile, own and cumulative time a step by
function (the constrained path's own Python). PYTHONPATH=. python host_prof.py"""
import cProfile, pstats, os, sys
os.environ["ROUNDS"] = "0"
exec(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "host_paths.py")).read().replace("llm.shutdown()", ""))
stats = {}
for f in ("free", "nogw"):
    p = cProfile.Profile(); p.enable(); r = go(f); p.disable(); stats[f] = (pstats.Stats(p), r[2])
def per(f):
    st, n = stats[f]
    return {f"{os.path.basename(k[0])}:{k[1]}:{k[2]}": (v[2]*1e6/n, v[3]*1e6/n, v[1]/n) for k, v in st.stats.items()}
a, b = per("free"), per("nogw")
keys = sorted(set(a) | set(b), key=lambda k: -abs(b.get(k, (0,0,0))[0] - a.get(k, (0,0,0))[0]))
print(f"{'function':64s} {'free tot':>9s} {'nogw tot':>9s} {'free cum':>9s} {'nogw cum':>9s} calls f/n")
for k in keys[:45]:
    x, y = a.get(k, (0,0,0)), b.get(k, (0,0,0))
    print(f"{k[-64:]:64s} {x[0]:9.1f} {y[0]:9.1f} {x[1]:9.1f} {y[1]:9.1f} {x[2]:6.2f}/{y[2]:6.2f}")
