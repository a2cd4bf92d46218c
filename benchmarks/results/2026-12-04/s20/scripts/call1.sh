# Twentieth session, call 1: the apply reading host rows at their address (DeviceAddress): its GPU
# tests and its engine-thread CPU a launch (s19 applycpu.py), then rounds in one engine: the copy to
# device rows (default) against host rows at their address.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
S=benchmarks/results/2026-12-04/s20/scripts
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_triton_launch_gpu.py tests/test_grammar_mask_copy_gpu.py tests/test_mask_slots.py > $OUT/pytest_1.log 2>&1
tail -3 $OUT/pytest_1.log
timeout 60 python3 benchmarks/results/2026-12-04/s19/scripts/applycpu.py $OUT/applycpu_1.json > $OUT/applycpu_1.log 2>&1; head -8 $OUT/applycpu_1.log
timeout 330 python3 $S/diag20.py --tokenizer .ab/tok --rounds 6 --variant host_rows --out $OUT/r05b_1.json > $OUT/r05b_1.log 2>&1; tail -4 $OUT/r05b_1.log
python3 benchmarks/results/2026-12-04/s16/scripts/table.py $OUT/r05b_1.json
