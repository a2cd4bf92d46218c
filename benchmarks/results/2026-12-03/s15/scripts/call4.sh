python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:.
S=benchmarks/results/2026-12-03/s15/scripts
timeout 190 python3 $S/diag.py --model qwen2.5-7b --tokenizer .ab/tok --rounds 1 --out $OUT/r7b_4.json > $OUT/r7b_4.log 2>&1
timeout 170 python3 $S/diag.py --tokenizer .ab/tok --rounds 6 --variant plumbing_only --out $OUT/r05b_4.json > $OUT/r05b_4.log 2>&1
python3 $S/table.py $OUT/r7b_4.json $OUT/r05b_4.json
grep -c "rejected sampled" $OUT/*.log; true
