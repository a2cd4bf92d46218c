python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:.
S=benchmarks/results/2026-12-04/s17/scripts
timeout 150 python3 $S/interfere.py --tokenizer .ab/tok --seconds 5 --threads 4,1 --out $OUT/interfere_2.json > $OUT/interfere_2.log 2>&1
timeout 330 python3 $S/diag17.py --tokenizer .ab/tok --rounds 8 --variant threads_1 --out $OUT/r05b_2.json > $OUT/r05b_2.log 2>&1
tail -5 $OUT/interfere_2.log
python3 benchmarks/results/2026-12-04/s16/scripts/table.py $OUT/r05b_2.json
grep -c "rejected sampled" $OUT/*.log; true
