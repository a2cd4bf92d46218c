# Nineteenth session, call 2: a GIL turn's price at switch intervals 1-5000 µs (turns.py), then the
# landed tree (50 µs while a grammar job runs) against 1, 5 and 20 µs in one engine (diag19.py).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
S=benchmarks/results/2026-12-04/s19/scripts
python3 $S/turns.py $OUT/turns_2.json 1 5 20 50 5000 | tr -d '\n '; echo
timeout 360 python3 $S/diag19.py --tokenizer .ab/tok --rounds 8 --variant switch_1us --variant switch_5us --variant switch_20us --out $OUT/r05b_2.json > $OUT/r05b_2.log 2>&1
python3 benchmarks/results/2026-12-04/s16/scripts/table.py $OUT/r05b_2.json
grep -c "rejected sampled" $OUT/*.log; true
