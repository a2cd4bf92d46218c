python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:.
S=benchmarks/results/2026-12-04/s17/scripts
timeout 140 python3 $S/diag17.py --tokenizer .ab/tok --rounds 6 --out $OUT/r05b_7.json > $OUT/r05b_7.log 2>&1
python3 benchmarks/results/2026-12-04/s16/scripts/table.py $OUT/r05b_7.json
grep -c "rejected sampled" $OUT/*.log; true
