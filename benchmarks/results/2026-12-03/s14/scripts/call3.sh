python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:.
S=benchmarks/results/2026-12-03/s14/scripts
ENGINE_CPU=2 timeout 260 python3 $S/pinned.py --tokenizer .ab/tok --rounds 6 --variant apart --variant apart_8 --out $OUT/pinned05b_3.json > $OUT/pinned05b_3.log 2>&1
timeout 200 python3 -m benchmarks.structured_output_rounds --model qwen2.5-7b --tokenizer .ab/tok --rounds 1 --out $OUT/final7b_3.json > $OUT/final7b_3.log 2>&1
head -3 $OUT/pinned05b_3.log | cut -c1-300
for f in pinned05b_3 final7b_3; do python3 -c "
import json; d=json.load(open('$OUT/$f.json'))['summary']
for k,v in d.items(): print('$f', k, {a:(round(b,3) if isinstance(b,float) else b) for a,b in v.items()} if isinstance(v,dict) else v)"; done
grep -c "rejected sampled" $OUT/*.log; true
