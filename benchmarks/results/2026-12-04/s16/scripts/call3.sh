python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:.
S=benchmarks/results/2026-12-04/s16/scripts
timeout 120 python3 $S/cpuspeed.py .ab/tok --reps 1500 > $OUT/cpuspeed_3.log 2>&1
timeout 240 python3 $S/diag16.py --tokenizer .ab/tok --rounds 8 --out $OUT/r05b_3.json > $OUT/r05b_3.log 2>&1
cat $OUT/cpuspeed_3.log | tail -8
python3 $S/table.py $OUT/r05b_3.json
