# Twenty-first session, prepared for the next session with a device (none was lent in this one):
# the host's thread wake-ups and GIL turns (s21 wake.py: the cpuidle driver, a lock ping-pong and the
# loss a GIL turn costs a Python thread, threads free, apart, apart with the CPUs kept awake, on one
# CPU), the scheduler alone hot (benchmarks/scheduler_cost.py: the host's Python pace against this
# machine's 0.204 ms a step of schedule + update), the GPU tests of the slots without the host-rows form (cd1a016), then the twentieth session's
# call 6 in 6 rounds: the landed tree beside no_grammar_work, deferral_only and lean_apply (s20
# diag20.py), one engine. 0 rejected tokens checks lean_apply's masks. Carry .whl and .ab/tok.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
S=benchmarks/results/2026-12-04/s20/scripts
timeout 75 python3 benchmarks/results/2026-12-04/s21/scripts/wake.py --out $OUT/wake_1.json > $OUT/wake_1.log 2>&1; cat $OUT/wake_1.log | cut -c1-200
timeout 60 python3 -m benchmarks.scheduler_cost --repeats 2 --out $OUT/scheduler_cost_1.json > $OUT/scheduler_cost_1.log 2>&1; tail -4 $OUT/scheduler_cost_1.log
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_triton_launch_gpu.py tests/test_grammar_mask_copy_gpu.py tests/test_mask_slots.py > $OUT/pytest_1.log 2>&1
tail -3 $OUT/pytest_1.log
timeout 360 python3 $S/diag20.py --tokenizer .ab/tok --rounds 6 --variant no_grammar_work --variant deferral_only --variant lean_apply --out $OUT/r05b_1.json > $OUT/r05b_1.log 2>&1; tail -3 $OUT/r05b_1.log
python3 benchmarks/results/2026-12-04/s16/scripts/table.py $OUT/r05b_1.json
grep -c "rejected sampled" $OUT/*.log; true
