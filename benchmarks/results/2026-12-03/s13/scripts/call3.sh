python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:.
S=benchmarks/results/2026-12-03/s13/scripts
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_grammar_mask_copy_gpu.py > $OUT/pytest3.log 2>&1; tail -1 $OUT/pytest3.log
timeout 150 python3 -m benchmarks.structured_output_rounds --model qwen2.5-7b --tokenizer .ab/tok --rounds 1 --out $OUT/final7b_3.json > $OUT/final7b_3.log 2>&1
timeout 110 python3 $S/ab_rounds.py --tokenizer .ab/tok --rounds 3 --out $OUT/ab05b_3.json > $OUT/ab05b_3.log 2>&1
for f in final7b_3 ab05b_3; do python3 -c "
import json; d=json.load(open('$OUT/$f.json'))['summary']
for k,v in d.items(): print('$f', k, {a:(round(b,3) if isinstance(b,float) else b) for a,b in v.items()} if isinstance(v,dict) else v)"; done
grep -c "rejected sampled" $OUT/*.log
