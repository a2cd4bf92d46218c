python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:.
S=benchmarks/results/2026-12-04/s16/scripts
lscpu > $OUT/lscpu_1.log 2>&1; nproc >> $OUT/lscpu_1.log
timeout 330 python3 $S/diag16.py --tokenizer .ab/tok --rounds 14 --out $OUT/r05b_1.json > $OUT/r05b_1.log 2>&1
python3 $S/table.py $OUT/r05b_1.json
grep -c "rejected sampled" $OUT/*.log; grep -E "^(Thread|Core|Socket|NUMA node0|Model name)" $OUT/lscpu_1.log; true
