# Thirtieth session, call 1: issue 17's criterion (8 rounds, the landed tree, clean) on whatever card
# comes, then on the same machine 6 rounds beside no_grammar_work with diag24's counters (sync_wait:
# the engine thread's wait for the device, to say whether the free step is host- or device-bound).
# Carry .whl and .ab/tok.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
(nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep "Model name"; nproc; uptime; python3 -c "import importlib.metadata as m; print('llguidance', m.version('llguidance'))") > $OUT/host_1.log 2>&1; cat $OUT/host_1.log
timeout 170 python3 -m benchmarks.structured_output_rounds --tokenizer .ab/tok --rounds 8 --out $OUT/r05b_1.json > $OUT/r05b_1.log 2>&1
timeout 260 python3 benchmarks/results/2026-12-05/s24/scripts/diag24.py --tokenizer .ab/tok --rounds 6 --variant no_grammar_work --out $OUT/d05b_1.json > $OUT/d05b_1.log 2>&1
grep -c "rejected sampled" $OUT/*.log; tail -3 $OUT/d05b_1.log | cut -c1-300
for f in $OUT/r05b_1.json $OUT/d05b_1.json; do python3 benchmarks/results/2026-12-04/s16/scripts/table.py $f; done; true
