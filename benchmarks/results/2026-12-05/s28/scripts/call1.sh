# Twenty-eighth session, call 1: issue 17's criterion on this host (workload 1, 0.5b, landed tree,
# 6 rounds in one engine), then the young-collection threshold's rounds (s25/scripts/call3.sh's first
# part). Carry .whl and .ab/tok.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep "Model name"
timeout 240 python3 -m benchmarks.structured_output_rounds --tokenizer .ab/tok --rounds 6 --out $OUT/r05b_1.json > $OUT/r05b_1.log 2>&1
S=benchmarks/results/2026-12-05/s25/scripts
timeout 200 python3 $S/young_gc_rounds.py --tokenizer .ab/tok --rounds 6 --out $OUT/young_gc_1.json > $OUT/young_gc_1.log 2>&1; tail -12 $OUT/young_gc_1.log
grep -c "rejected sampled" $OUT/*.log; python3 benchmarks/results/2026-12-04/s16/scripts/table.py $OUT/r05b_1.json; true
