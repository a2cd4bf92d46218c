# Eighteenth session, call 5: the landed tree's rounds with the JIT-launched apply as A/B, on a fresh machine.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
S=benchmarks/results/2026-12-04/s18/scripts
timeout 300 python3 $S/diag18.py --tokenizer .ab/tok --rounds 12 --variant jit_launch --out $OUT/r05b_5.json > $OUT/r05b_5.log 2>&1
python3 benchmarks/results/2026-12-04/s16/scripts/table.py $OUT/r05b_5.json
grep -c "rejected sampled" $OUT/*.log; true
