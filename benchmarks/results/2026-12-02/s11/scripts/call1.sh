python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:.
nproc; lscpu | grep -iE "model name|thread|core|socket|MHz|L2|L3|NUMA" ; cat /sys/devices/system/cpu/cpu0/topology/thread_siblings_list
timeout 150 python3 -m benchmarks.host_contention --tokenizer .ab/tok --threads 12 --repeats 3 --topology --out $OUT/contention.json > $OUT/contention.log 2>&1; tail -14 $OUT/contention.log
timeout 380 python3 benchmarks/results/2026-12-02/s11/scripts/threads_rounds.py --tokenizer .ab/tok --rounds 3 --variant threads2 --variant threads4 --variant threads8 --out $OUT/threads.json > $OUT/threads.log 2>&1; grep -v Warn $OUT/threads.log | tail -40
