python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:.
S=benchmarks/results/2026-12-04/s17/scripts
mkdir -p $OUT/prof_3
timeout 300 python3 $S/profdiff.py --tokenizer .ab/tok --pairs 2 --top 60 --out $OUT/prof_3 > $OUT/profdiff_3.log 2>&1
tail -64 $OUT/profdiff_3.log | cut -c1-150
