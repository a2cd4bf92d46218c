python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:.
S=benchmarks/results/2026-12-04/s17/scripts
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_mask_wait_gpu.py tests/test_grammar_mask_copy_gpu.py tests/test_mask_slots.py > $OUT/pytest_4.log 2>&1
tail -3 $OUT/pytest_4.log
timeout 330 python3 $S/diag17.py --tokenizer .ab/tok --rounds 8 --variant host_wait --out $OUT/r05b_4.json > $OUT/r05b_4.log 2>&1
python3 benchmarks/results/2026-12-04/s16/scripts/table.py $OUT/r05b_4.json
grep -c "rejected sampled" $OUT/*.log; tail -3 $OUT/r05b_4.log; true
