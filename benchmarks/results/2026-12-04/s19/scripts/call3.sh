# Nineteenth session, call 3: the landed tree against the 5 µs switch interval, the handshake at
# submit, and both, in one engine (diag19.py).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
S=benchmarks/results/2026-12-04/s19/scripts
timeout 420 python3 $S/diag19.py --tokenizer .ab/tok --rounds 8 --variant switch_5us --variant handshake --variant handshake_5us --out $OUT/r05b_3.json > $OUT/r05b_3.log 2>&1
python3 benchmarks/results/2026-12-04/s16/scripts/table.py $OUT/r05b_3.json
grep -c "rejected sampled" $OUT/*.log; true
