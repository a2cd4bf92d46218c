# Twenty-seventh session: call4b of s25 again (after call1a.sh, back to back) with the KV sizing fix and its test
# (on the H100 the second engine of a GPU suite found 0.00 GiB: the first one's pool still counted as used). Carry .ab/smol/part_ab, .ab/smol/sha256, .whl.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
export AIOINFER_CACHE=/tmp/smolcache; D=$AIOINFER_CACHE/smollm2-135m-instruct; mkdir -p $D
cat /tmp/smol/part_aa .ab/smol/part_ab > $D/SmolLM2-135M-Instruct.Q4_1.gguf
test "$(sha256sum $D/SmolLM2-135M-Instruct.Q4_1.gguf | cut -c1-64)" = "$(cat .ab/smol/sha256)" && echo "gguf ok" || echo "GGUF CORRUPT"
S=benchmarks/results/2026-12-05/s27/scripts; cp aioinfer/worker/kv_cache.py /tmp/kv_new.py; cp $S/kv_cache_old.py aioinfer/worker/kv_cache.py
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_kv_sizing_gpu.py > $OUT/pytest_old_1.log 2>&1; echo "old tree:"; tail -2 $OUT/pytest_old_1.log; cp /tmp/kv_new.py aioinfer/worker/kv_cache.py
timeout 480 python3 -m pytest -q -p no:cacheprovider tests/test_kv_sizing_gpu.py tests/test_structured_outputs_gpu.py tests/test_masked_greedy.py tests/test_gc_deferral.py tests/test_sampler.py > $OUT/pytest_1.log 2>&1; tail -5 $OUT/pytest_1.log
