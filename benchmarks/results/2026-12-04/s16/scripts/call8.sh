python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:.
S=benchmarks/results/2026-12-04/s16/scripts
timeout 110 python3 $S/diag16.py --tokenizer .ab/tok --rounds 5 --out $OUT/r05b_8.json > $OUT/r05b_8.log 2>&1
python3 $S/table.py $OUT/r05b_8.json; tail -3 $OUT/r05b_8.log
