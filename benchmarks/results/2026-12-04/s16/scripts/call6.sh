python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:.
S=benchmarks/results/2026-12-04/s16/scripts
timeout 220 python3 $S/diag16.py --tokenizer .ab/tok --rounds 8 --out $OUT/r05b_6.json > $OUT/r05b_6.log 2>&1
timeout 170 python3 $S/diag16.py --model qwen2.5-7b --tokenizer .ab/tok --rounds 1 --out $OUT/r7b_6.json > $OUT/r7b_6.log 2>&1
python3 $S/table.py $OUT/r05b_6.json $OUT/r7b_6.json
grep -c "rejected sampled" $OUT/*.log; true
