python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:.
S=benchmarks/results/2026-12-03/s15/scripts
nproc; python3 -c "import os; print(len(os.sched_getaffinity(0)))"
timeout 400 python3 $S/diag.py --tokenizer .ab/tok --rounds 10 --variant threads_12 --variant threads_6 --out $OUT/r05b_3.json > $OUT/r05b_3.log 2>&1
python3 $S/table.py $OUT/r05b_3.json
grep -c "rejected sampled" $OUT/*.log; true
