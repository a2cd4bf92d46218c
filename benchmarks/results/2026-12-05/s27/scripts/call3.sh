# Twenty-seventh session, call 3 (machines scarce: one call for both): the KV sizing test on the old
# kv_cache.py then the GPU tests that need no GGUF (SmolLM2's are call1a/1b's), then issue 17's
# criterion on this host (workload 1, 0.5b, landed tree, 6 rounds in one engine). Carry .whl and .ab/tok.
# kv_cache_old.py was `git show b1ccabe:aioinfer/worker/kv_cache.py`, kept beside this script for the call and removed after.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep "Model name"
S=benchmarks/results/2026-12-05/s27/scripts; cp aioinfer/worker/kv_cache.py /tmp/kv_new.py; cp $S/kv_cache_old.py aioinfer/worker/kv_cache.py
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_kv_sizing_gpu.py > $OUT/pytest_old_3.log 2>&1; echo "old kv_cache.py:"; tail -1 $OUT/pytest_old_3.log; cp /tmp/kv_new.py aioinfer/worker/kv_cache.py
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_kv_sizing_gpu.py tests/test_masked_greedy.py tests/test_gc_deferral.py tests/test_sampler.py tests/test_structured_outputs_gpu.py -k "not gpu_schemas_validate and not device_apply_equals" > $OUT/pytest_3.log 2>&1; tail -4 $OUT/pytest_3.log
timeout 230 python3 -m benchmarks.structured_output_rounds --tokenizer .ab/tok --rounds 6 --out $OUT/r05b_3.json > $OUT/r05b_3.log 2>&1
grep -c "rejected sampled" $OUT/*.log; python3 benchmarks/results/2026-12-04/s16/scripts/table.py $OUT/r05b_3.json; true
