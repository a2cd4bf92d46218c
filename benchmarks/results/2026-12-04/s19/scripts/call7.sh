# Nineteenth session, call 7: the apply given the host rows' address (DeviceAddress): its GPU tests,
# then its engine-thread CPU a launch against the tensor forms (applycpu.py). Prepared, not run (the
# device time ran out): the patch is applied to the machine's copy of the tree first.
git apply benchmarks/results/2026-12-04/s19/device_address.patch || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
S=benchmarks/results/2026-12-04/s19/scripts
timeout 60 python3 $S/applycpu.py $OUT/applycpu_7.json > $OUT/applycpu_7.log 2>&1; head -7 $OUT/applycpu_7.log
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_triton_launch_gpu.py tests/test_grammar_mask_copy_gpu.py tests/test_mask_slots.py > $OUT/pytest_7.log 2>&1
tail -3 $OUT/pytest_7.log
