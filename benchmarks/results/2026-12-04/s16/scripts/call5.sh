python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:.
S=benchmarks/results/2026-12-04/s16/scripts
timeout 200 python3 $S/diag16.py --tokenizer .ab/tok --rounds 8 --out $OUT/r05b_5.json > $OUT/r05b_5.log 2>&1
timeout 120 python3 -m pytest -q tests/test_grammar_mask_copy_gpu.py tests/test_gpu_engine.py -p no:cacheprovider > $OUT/pytest5.log 2>&1; tail -2 $OUT/pytest5.log
python3 $S/table.py $OUT/r05b_5.json
