# Twenty-ninth session, call 6: issue 17's criterion once more (6 rounds) on whatever card comes. Carry .whl and .ab/tok.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep "Model name"; nproc; uptime
timeout 100 python3 -m benchmarks.structured_output_rounds --tokenizer .ab/tok --rounds 6 --out $OUT/r05b_6.json > $OUT/r05b_6.log 2>&1
grep -c "rejected sampled" $OUT/*.log; python3 benchmarks/results/2026-12-04/s16/scripts/table.py $OUT/r05b_6.json; true
