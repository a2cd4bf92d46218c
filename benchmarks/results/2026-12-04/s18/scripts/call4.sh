# Eighteenth session, call 4: CompiledLaunch's GPU test (fixed) with the slots' and the sampler's; the
# landed tree's rounds on another host; its timeline trace.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
S=benchmarks/results/2026-12-04/s18/scripts
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_triton_launch_gpu.py tests/test_grammar_mask_copy_gpu.py tests/test_mask_slots.py > $OUT/pytest_4.log 2>&1
tail -1 $OUT/pytest_4.log
timeout 230 python3 $S/diag18.py --tokenizer .ab/tok --rounds 14 --out $OUT/r05b_4.json > $OUT/r05b_4.log 2>&1
TRACE=$OUT/trace_4.json timeout 100 python3 $S/trace18.py --tokenizer .ab/tok --rounds 4 --out $OUT/t05b_4.json > $OUT/t05b_4.log 2>&1
python3 benchmarks/results/2026-12-04/s16/scripts/table.py $OUT/r05b_4.json $OUT/t05b_4.json
tail -3 $OUT/t05b_4.log; grep -c "rejected sampled" $OUT/*.log; true
