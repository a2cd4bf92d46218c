python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:.
S=benchmarks/results/2026-12-03/s14/scripts
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_grammar_mask_copy_gpu.py > $OUT/pytest1.log 2>&1; tail -1 $OUT/pytest1.log
timeout 330 python3 $S/ab_rounds.py --tokenizer .ab/tok --rounds 5 --variant late_sample --variant threads_4 --variant threads_8 --out $OUT/ab05b_1.json > $OUT/ab05b_1.log 2>&1
grep "^round" $OUT/ab05b_1.log | cut -c1-110
python3 -c "
import json; d=json.load(open('$OUT/ab05b_1.json'))['summary']
for k,v in d.items(): print(k, {a:(round(b,3) if isinstance(b,float) else b) for a,b in v.items()} if isinstance(v,dict) else v)"
grep -c "rejected sampled" $OUT/*.log
