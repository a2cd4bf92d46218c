# Thirtieth session, call 2: on an H200, issue 17's criterion first (6 rounds, the landed tree, clean);
# then where the constrained step's extra host time goes on this host (sections_gpu.py: free,
# constrained, no_grammar_work, 3 rounds; 2 after the criterion on an H200); the session's
# device time left (314 s) allows no criterion run on an H100.
# Carry .whl and .ab/tok.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
(nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep "Model name"; nproc; uptime) > $OUT/host_2.log 2>&1; cat $OUT/host_2.log
criterion() { timeout 170 python3 -m benchmarks.structured_output_rounds --tokenizer .ab/tok --rounds $1 --out $OUT/r05b_2.json > $OUT/r05b_2.log 2>&1; }
if grep -q H200 $OUT/host_2.log; then criterion 6; R=2; else R=3; fi
ROUNDS=$R timeout 130 python3 benchmarks/results/2026-12-06/s30/scripts/sections_gpu.py > $OUT/sections_2.log 2>&1
grep -c "rejected sampled" $OUT/*.log; tail -32 $OUT/sections_2.log | cut -c1-130
python3 benchmarks/results/2026-12-04/s16/scripts/table.py $OUT/r05b_2.json; true
