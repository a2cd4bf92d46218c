python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:.
S=benchmarks/results/2026-12-03/s14/scripts
timeout 420 python3 $S/ab_rounds.py --tokenizer .ab/tok --rounds 8 --variant late_sample --variant threads_8 --variant late_threads_8 --out $OUT/ab05b_2.json > $OUT/ab05b_2.log 2>&1
grep "^round" $OUT/ab05b_2.log | cut -c1-100 | tail -20
python3 -c "
import json; d=json.load(open('$OUT/ab05b_2.json'))['summary']
for k,v in d.items(): print(k, {a:(round(b,3) if isinstance(b,float) else b) for a,b in v.items()} if isinstance(v,dict) else v)"
grep -c "rejected sampled" $OUT/*.log
