python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:.
S=benchmarks/results/2026-12-04/s16/scripts
nproc; python3 -c "import os; print(sorted(os.sched_getaffinity(0)))"
timeout 330 python3 $S/pinprobe.py --tokenizer .ab/tok --rounds 4 --cpu 3 --out $OUT/pin_2.json > $OUT/pin_2.log 2>&1
tail -22 $OUT/pin_2.log
