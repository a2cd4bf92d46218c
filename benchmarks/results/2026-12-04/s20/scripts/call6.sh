# Prepared for the next session (not run): the path's cost split on one host: no grammar work
# (copy + apply + deferral) against the deferral alone, and the apply through its bound C launcher
# (lean_apply), beside the landed tree. 0 rejected tokens checks the lean launch's masks.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
S=benchmarks/results/2026-12-04/s20/scripts
timeout 560 python3 $S/diag20.py --tokenizer .ab/tok --rounds 8 --variant no_grammar_work --variant deferral_only --variant lean_apply --out $OUT/r05b_6.json > $OUT/r05b_6.log 2>&1
python3 benchmarks/results/2026-12-04/s16/scripts/table.py $OUT/r05b_6.json
grep -c "rejected sampled" $OUT/*.log; true
