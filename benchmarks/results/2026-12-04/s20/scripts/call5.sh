# Twentieth session, call 5: llguidance on 2 and 3 threads against the default 4 (landed tree) on a slow host.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
S=benchmarks/results/2026-12-04/s20/scripts
timeout 330 python3 $S/diag20.py --tokenizer .ab/tok --rounds 8 --variant threads_2 --variant threads_3 --out $OUT/r05b_5.json > $OUT/r05b_5.log 2>&1
python3 benchmarks/results/2026-12-04/s16/scripts/table.py $OUT/r05b_5.json
