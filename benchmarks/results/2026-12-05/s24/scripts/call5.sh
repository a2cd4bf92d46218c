# Twenty-fourth session, call 5: tests/test_structured_outputs_gpu.py with the fused masked greedy on
# (calls 3-4 lacked jsonschema: fetch-wheels.sh jsonschema jsonschema-specifications referencing
# rpds-py attrs), then 4 more rounds of the landed tree beside three_launches. Carry .whl and .ab/tok.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
S=benchmarks/results/2026-12-05/s24/scripts
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_structured_outputs_gpu.py tests/test_masked_greedy.py > $OUT/pytest_5.log 2>&1
tail -3 $OUT/pytest_5.log
timeout 150 python3 $S/diag24.py --tokenizer .ab/tok --rounds 4 --variant three_launches --out $OUT/r05b_5.json > $OUT/r05b_5.log 2>&1; tail -3 $OUT/r05b_5.log
python3 benchmarks/results/2026-12-04/s16/scripts/table.py $OUT/r05b_5.json
grep -c "rejected sampled" $OUT/*.log; true
