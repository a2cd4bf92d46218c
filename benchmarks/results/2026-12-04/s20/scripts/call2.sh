# Twentieth session, call 2: the landed tree (masks copied to device rows) in 24 paired rounds, one
# engine: the ratio's spread on this host.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
S=benchmarks/results/2026-12-04/s20/scripts
nproc; cat /proc/loadavg
timeout 500 python3 $S/diag20.py --tokenizer .ab/tok --rounds 24 --out $OUT/r05b_2.json > $OUT/r05b_2.log 2>&1; tail -2 $OUT/r05b_2.log
cat /proc/loadavg
python3 benchmarks/results/2026-12-04/s16/scripts/table.py $OUT/r05b_2.json
