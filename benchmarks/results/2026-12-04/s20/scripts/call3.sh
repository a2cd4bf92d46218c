# Twentieth session, call 3: the landed tree (copy to device rows) on the 7b shape, then the 0.5b shape
# with host rows at their address and with no grammar work beside it in one engine; vmstat (steal)
# through both.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
S=benchmarks/results/2026-12-04/s20/scripts
vmstat -t 1 > $OUT/vmstat_3.log 2>&1 &
timeout 220 python3 $S/diag20.py --model qwen2.5-7b --tokenizer .ab/tok --rounds 2 --out $OUT/r7b_3.json > $OUT/r7b_3.log 2>&1
echo 7b-done; date
timeout 320 python3 $S/diag20.py --tokenizer .ab/tok --rounds 8 --variant host_rows --variant no_grammar_work --out $OUT/r05b_3.json > $OUT/r05b_3.log 2>&1
kill %1
python3 benchmarks/results/2026-12-04/s16/scripts/table.py $OUT/r7b_3.json $OUT/r05b_3.json
grep -c "rejected sampled" $OUT/*.log
awk 'NR>2 {us+=$13; sy+=$14; id+=$15; wa+=$16; st+=$17; n++} END {printf "vmstat %d s: us %.1f sy %.1f id %.1f wa %.1f st %.1f\n", n, us/n, sy/n, id/n, wa/n, st/n}' $OUT/vmstat_3.log
true
