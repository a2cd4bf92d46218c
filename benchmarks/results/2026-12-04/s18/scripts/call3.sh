# Eighteenth session, call 3: GPU tests (CompiledLaunch, the slots, the apply, the noise kernel); the
# rounds with the apply through its kept compiled kernel against the JIT's launch (jit_launch) in one
# engine; the timeline trace of the tree; 7b one round.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
S=benchmarks/results/2026-12-04/s18/scripts
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_triton_launch_gpu.py tests/test_grammar_mask_copy_gpu.py tests/test_mask_slots.py tests/test_sampler.py > $OUT/pytest_3.log 2>&1
tail -1 $OUT/pytest_3.log
timeout 200 python3 $S/diag18.py --tokenizer .ab/tok --rounds 10 --variant jit_launch --out $OUT/r05b_3.json > $OUT/r05b_3.log 2>&1
TRACE=$OUT/trace_3.json timeout 100 python3 $S/trace18.py --tokenizer .ab/tok --rounds 4 --out $OUT/t05b_3.json > $OUT/t05b_3.log 2>&1
timeout 150 python3 $S/diag18.py --model qwen2.5-7b --tokenizer .ab/tok --rounds 1 --out $OUT/r7b_3.json > $OUT/r7b_3.log 2>&1
python3 benchmarks/results/2026-12-04/s16/scripts/table.py $OUT/r05b_3.json $OUT/r7b_3.json
tail -3 $OUT/t05b_3.log; grep -c "rejected sampled" $OUT/*.log; true
