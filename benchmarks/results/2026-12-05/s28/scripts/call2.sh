# Twenty-eighth session, call 2 (on the same warm machine as call 1): the young-collection threshold
# through the server (s25/scripts/call3.sh's second part), then the criterion once more for the
# spread of one host. Carry .whl and .ab/tok.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep "Model name"
for env in AIOINFER_GC_YOUNG_THRESHOLD=0 AIOINFER_GC_YOUNG_THRESHOLD=20000; do
  timeout 180 python3 -m benchmarks.serve_throughput --model qwen2.5-0.5b --tokenizer .ab/tok --modes server --clients 4 --engine-env $env --out $OUT/serve_${env##*=}_2.json > $OUT/serve_${env##*=}_2.log 2>&1
  grep -E "^\| server" $OUT/serve_${env##*=}_2.log | cut -c1-220
done
timeout 220 python3 -m benchmarks.structured_output_rounds --tokenizer .ab/tok --rounds 6 --out $OUT/r05b_2.json > $OUT/r05b_2.log 2>&1
python3 benchmarks/results/2026-12-04/s16/scripts/table.py $OUT/r05b_2.json; true
