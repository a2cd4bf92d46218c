# Prepared for the next session (not run in the twenty-fifth: no device after call 1). The young-
# collection threshold (utils/gc_deferral.py, landed in the twenty-fifth session on CPU figures) on
# the H200: workload 1 free, 0.5b, landed against the interpreter's 700 in one engine
# (young_gc_rounds.py), then the server beside it (serve_throughput, the server's environment
# switched with --engine-env). Carry .whl and .ab/tok.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
S=benchmarks/results/2026-12-05/s25/scripts
timeout 200 python3 $S/young_gc_rounds.py --tokenizer .ab/tok --rounds 6 --out $OUT/young_gc_3.json > $OUT/young_gc_3.log 2>&1; tail -24 $OUT/young_gc_3.log
for env in AIOINFER_GC_YOUNG_THRESHOLD=0 AIOINFER_GC_YOUNG_THRESHOLD=20000; do
  timeout 180 python3 -m benchmarks.serve_throughput --model qwen2.5-0.5b --tokenizer .ab/tok --modes server --clients 4 --engine-env $env --out $OUT/serve_${env##*=}_3.json > $OUT/serve_${env##*=}_3.log 2>&1
  grep -E "^\| server" $OUT/serve_${env##*=}_3.log | cut -c1-220
done; true
