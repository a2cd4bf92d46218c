python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:.
S=benchmarks/results/2026-12-04/s16/scripts
timeout 150 python3 $S/gcwho.py .ab/tok > $OUT/gcwho_7.log 2>&1; grep -v Warn $OUT/gcwho_7.log | tail -14 | cut -c1-600
