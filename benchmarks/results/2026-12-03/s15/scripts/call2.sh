python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:.
S=benchmarks/results/2026-12-03/s15/scripts
timeout 420 python3 $S/diag.py --tokenizer .ab/tok --rounds 6 --variant plumbing_only --variant inline --variant threads_2 --variant threads_4 --out $OUT/r05b_2.json > $OUT/r05b_2.log 2>&1
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_grammar_mask_copy_gpu.py tests/test_structured_outputs_gpu.py > $OUT/pytest2.log 2>&1; tail -1 $OUT/pytest2.log
python3 $S/table.py $OUT/r05b_2.json
grep -c "rejected sampled" $OUT/*.log; true
