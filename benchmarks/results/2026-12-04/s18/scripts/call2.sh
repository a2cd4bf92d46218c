# Eighteenth session, call 2: the timeline trace (trace18.py) of free and constrained steps, with
# finish_first (a step ahead sampled before the next is prepared) and threads_8 as A/B forms.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
S=benchmarks/results/2026-12-04/s18/scripts
TRACE=$OUT/trace_2.json timeout 420 python3 $S/trace18.py --tokenizer .ab/tok --rounds 10 --variant finish_first --variant threads_8 --out $OUT/r05b_2.json > $OUT/r05b_2.log 2>&1
python3 benchmarks/results/2026-12-04/s16/scripts/table.py $OUT/r05b_2.json
tail -3 $OUT/r05b_2.log; grep -c "rejected sampled" $OUT/*.log; true
