# Nineteenth session, call 4: the landed tree against the same path with no grammar work at all
# (no_grammar_work: the bound for a grammar process), in one engine (diag19.py).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
S=benchmarks/results/2026-12-04/s19/scripts
timeout 400 python3 $S/diag19.py --tokenizer .ab/tok --rounds 8 --variant no_grammar_work --out $OUT/r05b_4.json > $OUT/r05b_4.log 2>&1
python3 benchmarks/results/2026-12-04/s16/scripts/table.py $OUT/r05b_4.json
grep -c "rejected sampled" $OUT/*.log; true
