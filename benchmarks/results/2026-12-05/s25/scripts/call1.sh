# Twenty-fifth session, call 1: the host (lscpu), then workload 1 on the 0.5b shape: the landed tree
# (fused masked greedy on) beside no_grammar_work (the bound for any placement of the grammar work,
# first measured with the fused kernel on). Carry .whl and .ab/tok.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
S=benchmarks/results/2026-12-05/s24/scripts
lscpu > $OUT/lscpu_1.log 2>&1; nproc >> $OUT/lscpu_1.log
timeout 420 python3 $S/diag24.py --tokenizer .ab/tok --rounds 8 --variant no_grammar_work --out $OUT/r05b_1.json > $OUT/r05b_1.log 2>&1; tail -3 $OUT/r05b_1.log
python3 benchmarks/results/2026-12-04/s16/scripts/table.py $OUT/r05b_1.json
grep -E "^(Model name|Thread|Core|Socket)" $OUT/lscpu_1.log; grep -c "rejected sampled" $OUT/*.log; true
