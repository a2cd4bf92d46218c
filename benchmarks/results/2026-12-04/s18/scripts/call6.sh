# Eighteenth session, call 6: the final tree (triton_available moved to utils/triton_launch.py, kept
# kernels capped) on a fresh machine: its GPU tests, then the rounds.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
S=benchmarks/results/2026-12-04/s18/scripts
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_triton_launch_gpu.py tests/test_grammar_mask_copy_gpu.py tests/test_mask_slots.py tests/test_sampler.py > $OUT/pytest_6.log 2>&1
tail -1 $OUT/pytest_6.log
timeout 150 python3 $S/diag18.py --tokenizer .ab/tok --rounds 8 --out $OUT/r05b_6.json > $OUT/r05b_6.log 2>&1
python3 benchmarks/results/2026-12-04/s16/scripts/table.py $OUT/r05b_6.json
grep -c "rejected sampled" $OUT/*.log; true
