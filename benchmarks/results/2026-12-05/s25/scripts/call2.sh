# Prepared for the next session (not run in the twenty-fifth: no device after call 1). Where the
# constrained path's engine-thread time goes on the H200 host, function by function (cProfile: free,
# constrained and no_grammar_work runs of workload 1, 0.5b), then 6 rounds splitting the path around
# the grammar work: no_grammar_work (deferral + copy + fused sampling) against deferral_only (the
# deferral alone: nothing copied or applied). Carry .whl and .ab/tok.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
S=benchmarks/results/2026-12-05/s25/scripts
timeout 240 python3 $S/profile_paths.py > $OUT/profile_2.log 2>&1; tail -75 $OUT/profile_2.log | cut -c1-150
timeout 330 python3 benchmarks/results/2026-12-05/s24/scripts/diag24.py --tokenizer .ab/tok --rounds 6 --variant no_grammar_work --variant deferral_only --out $OUT/r05b_2.json > $OUT/r05b_2.log 2>&1
python3 benchmarks/results/2026-12-04/s16/scripts/table.py $OUT/r05b_2.json
grep -c "rejected sampled" $OUT/*.log; true
