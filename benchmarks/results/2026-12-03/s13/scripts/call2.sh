python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:.
S=benchmarks/results/2026-12-03/s13/scripts
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_grammar_mask_copy_gpu.py tests/test_grammar_worker.py::test_the_thread_ends_on_close_and_when_dropped > $OUT/pytest2.log 2>&1; tail -2 $OUT/pytest2.log
timeout 230 python3 $S/ab_rounds.py --tokenizer .ab/tok --rounds 8 --variant no_ring --variant apply_torch --out $OUT/ab05b_2.json > $OUT/ab05b_2.log 2>&1
timeout 190 python3 -m benchmarks.structured_output_rounds --model qwen2.5-7b --tokenizer .ab/tok --rounds 2 --out $OUT/final7b.json > $OUT/final7b.log 2>&1
for f in ab05b_2 final7b; do python3 -c "
import json; d=json.load(open('$OUT/$f.json'))['summary']
for k,v in d.items(): print('$f', k, {a:(round(b,3) if isinstance(b,float) else b) for a,b in v.items()} if isinstance(v,dict) else v)"; done
grep -E "Error|rejected" $OUT/*.log | head -5
