python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:.
S=benchmarks/results/2026-12-03/s14/scripts
timeout 150 python3 $S/host_pieces.py .ab/tok > $OUT/host_pieces_5.log 2>&1; tail -20 $OUT/host_pieces_5.log
