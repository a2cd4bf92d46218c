python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:.
S=benchmarks/results/2026-12-04/s16/scripts
timeout 200 python3 $S/diag16.py --freeze --tokenizer .ab/tok --rounds 6 --out $OUT/r05b_frozen_4.json > $OUT/r05b_frozen_4.log 2>&1
timeout 150 python3 $S/diag16.py --tokenizer .ab/tok --rounds 4 --out $OUT/r05b_4.json > $OUT/r05b_4.log 2>&1
grep frozen $OUT/r05b_frozen_4.log
python3 $S/table.py $OUT/r05b_frozen_4.json $OUT/r05b_4.json
