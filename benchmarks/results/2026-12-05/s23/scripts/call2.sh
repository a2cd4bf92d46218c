# Twenty-third session, prepared: call 1's A/B again with the free side's twin on for the whole
# engine (diag23.py --argmax-raw: plain greedy steps take the argmax of the bf16 logits, free and
# constrained runs alike), so masked_greedy is compared with a free step that also drops its float
# copy; the free runs' tok/s against call 1's say what the twin gives the free path (different
# engines: read with the host's drift in mind). Carry .whl and .ab/tok.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
S=benchmarks/results/2026-12-05/s23/scripts
timeout 540 python3 $S/diag23.py --argmax-raw --tokenizer .ab/tok --rounds 8 --variant masked_greedy --out $OUT/r05b_2.json > $OUT/r05b_2.log 2>&1; tail -3 $OUT/r05b_2.log
python3 benchmarks/results/2026-12-04/s16/scripts/table.py $OUT/r05b_2.json
grep -c "rejected sampled" $OUT/*.log; true
