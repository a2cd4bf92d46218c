# Twenty-seventh session, call 2 (after the GPU tests): issue 17's criterion on this host, workload 1
# on the 0.5b shape, the landed tree (benchmarks/structured_output_rounds: free against every request
# JSON-constrained, in one engine, 8 rounds), then the young-collection threshold's rounds (s25's
# young_gc_rounds.py, 5 rounds: landed 20,000 against the interpreter's 700, free). Carry .whl and .ab/tok.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
lscpu > $OUT/lscpu_2.log 2>&1; nvidia-smi --query-gpu=name --format=csv,noheader >> $OUT/lscpu_2.log
timeout 300 python3 -m benchmarks.structured_output_rounds --tokenizer .ab/tok --rounds 8 --out $OUT/r05b_2.json > $OUT/r05b_2.log 2>&1
timeout 230 python3 benchmarks/results/2026-12-05/s25/scripts/young_gc_rounds.py --tokenizer .ab/tok --rounds 5 --out $OUT/young_gc_2.json > $OUT/young_gc_2.log 2>&1; tail -12 $OUT/young_gc_2.log | cut -c1-200
grep -E "^(Model name)" $OUT/lscpu_2.log; tail -1 $OUT/lscpu_2.log; grep -c "rejected sampled" $OUT/*.log
python3 benchmarks/results/2026-12-04/s16/scripts/table.py $OUT/r05b_2.json; true
