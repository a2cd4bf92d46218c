# Prepared for the next session, not run in this one (its device time was spent): the rounds with
# the engine thread isolated on CPU 15 (every other thread of the process moved off it), the two
# copy variants in one engine, and the interference probe with a working set of the engine's size.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:.
S=benchmarks/results/2026-12-04/s17/scripts
timeout 200 python3 $S/diag17.py --tokenizer .ab/tok --rounds 8 --variant zero_copy --variant compute_copy --out $OUT/r05b_copies.json > $OUT/r05b_copies.log 2>&1
timeout 150 python3 $S/diag17.py --isolate 15 --tokenizer .ab/tok --rounds 8 --out $OUT/r05b_isolated.json > $OUT/r05b_isolated.log 2>&1
timeout 100 python3 $S/interfere.py --tokenizer .ab/tok --seconds 5 --threads 4 --objects 40000 --out $OUT/interfere_big.json > $OUT/interfere_big.log 2>&1
python3 benchmarks/results/2026-12-04/s16/scripts/table.py $OUT/r05b_copies.json $OUT/r05b_isolated.json
tail -3 $OUT/interfere_big.log; grep -c "rejected sampled" $OUT/*.log; true
