# Call B of the SmolLM2 pair (call4a.sh first, back to back): the GGUF joined under $AIOINFER_CACHE, checked,
# then the structured-output GPU tests, the masked greedy's and the sampler's (min_tokens beside a grammar, s26). Carry .ab/smol/part_ab, .ab/smol/sha256, .whl.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
export AIOINFER_CACHE=/tmp/smolcache; D=$AIOINFER_CACHE/smollm2-135m-instruct; mkdir -p $D
cat /tmp/smol/part_aa .ab/smol/part_ab > $D/SmolLM2-135M-Instruct.Q4_1.gguf
test "$(sha256sum $D/SmolLM2-135M-Instruct.Q4_1.gguf | cut -c1-64)" = "$(cat .ab/smol/sha256)" && echo "gguf ok" || echo "GGUF CORRUPT"
timeout 500 python3 -m pytest -q -p no:cacheprovider tests/test_structured_outputs_gpu.py tests/test_masked_greedy.py tests/test_gc_deferral.py tests/test_sampler.py > $OUT/pytest_4.log 2>&1; tail -5 $OUT/pytest_4.log
