# Twenty-ninth session, call 1: issue 17's criterion (workload 1, 0.5b, landed tree, 6 rounds in one
# engine); on an H200 a second run of it in the same call. Carry .whl and .ab/tok.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$GPU"; lscpu | grep "Model name"; nproc
timeout 240 python3 -m benchmarks.structured_output_rounds --tokenizer .ab/tok --rounds 6 --out $OUT/r05b_1.json > $OUT/r05b_1.log 2>&1
case "$GPU" in *H200*) timeout 240 python3 -m benchmarks.structured_output_rounds --tokenizer .ab/tok --rounds 6 --out $OUT/r05b_2.json > $OUT/r05b_2.log 2>&1;; esac
grep -c "rejected sampled" $OUT/*.log; for f in $OUT/r05b_*.json; do python3 benchmarks/results/2026-12-04/s16/scripts/table.py $f; done; true
