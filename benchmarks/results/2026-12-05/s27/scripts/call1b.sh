# Twenty-seventh session, call 4 (call1a.sh, then this one back to back; as run): the SmolLM2 GGUF joined
# under $AIOINFER_CACHE and checked, then the KV sizing test and the structured-output GPU tests (their
# bfloat16 schemas test found 0.00 GiB on the H100 in call 1, before the KV sizing fix; call 3 ran the
# other GPU suites). Carry .ab/smol/part_ab, .ab/smol/sha256, .whl.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
export AIOINFER_CACHE=/tmp/smolcache; D=$AIOINFER_CACHE/smollm2-135m-instruct; mkdir -p $D
cat /tmp/smol/part_aa .ab/smol/part_ab > $D/SmolLM2-135M-Instruct.Q4_1.gguf
test "$(sha256sum $D/SmolLM2-135M-Instruct.Q4_1.gguf | cut -c1-64)" = "$(cat .ab/smol/sha256)" && echo "gguf ok" || echo "GGUF CORRUPT"
timeout 180 python3 -m pytest -q -p no:cacheprovider tests/test_kv_sizing_gpu.py tests/test_structured_outputs_gpu.py > $OUT/pytest_1.log 2>&1; tail -5 $OUT/pytest_1.log
