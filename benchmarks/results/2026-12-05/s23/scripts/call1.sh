# Twenty-third session, prepared for the next session with a device (none was lent in this one):
# the GPU tests of the fused masked greedy kernel (tests/test_masked_greedy.py: the kernel against
# apply + float + argmax, and an engine with it on against off, a tiny random Qwen2) and of the
# slots (s21's change, not GPU-tested yet), then rounds of workload 1 on the 0.5b shape, one engine:
# the landed tree beside masked_greedy, lean_apply and no_grammar_work (s23 diag23.py), after the
# sampling forms' device time and CPU a launch alone (kernel_time.py). 0 rejected
# tokens checks masked_greedy's tokens fit the masks. Carry .whl and .ab/tok.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
S=benchmarks/results/2026-12-05/s23/scripts
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_masked_greedy.py tests/test_triton_launch_gpu.py tests/test_grammar_mask_copy_gpu.py tests/test_mask_slots.py > $OUT/pytest_1.log 2>&1
tail -3 $OUT/pytest_1.log
timeout 60 python3 $S/kernel_time.py --out $OUT/kernel_time_1.json > $OUT/kernel_time_1.log 2>&1; cat $OUT/kernel_time_1.log
timeout 370 python3 $S/diag23.py --tokenizer .ab/tok --rounds 6 --variant masked_greedy --variant lean_apply --variant no_grammar_work --out $OUT/r05b_1.json > $OUT/r05b_1.log 2>&1; tail -3 $OUT/r05b_1.log
python3 benchmarks/results/2026-12-04/s16/scripts/table.py $OUT/r05b_1.json
grep -c "rejected sampled" $OUT/*.log; true
