# Nineteenth session, call 6: the apply's engine-thread CPU a call and its profile (applycpu.py).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
S=benchmarks/results/2026-12-04/s19/scripts
timeout 120 python3 $S/applycpu.py $OUT/applycpu_6.json > $OUT/applycpu_6.log 2>&1
head -60 $OUT/applycpu_6.log
