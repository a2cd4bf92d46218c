python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:.
S=benchmarks/results/2026-12-04/s16/scripts
timeout 100 python3 -m pytest -q -x tests/test_grammar_mask_copy_gpu.py tests/test_mask_slots.py tests/test_sampling_metadata_cache.py -p no:cacheprovider > $OUT/pytest1.log 2>&1; tail -2 $OUT/pytest1.log
for k in free json; do timeout 80 python3 $S/phases.py --kind $k --tokenizer .ab/tok --repeats 2 > $OUT/phases_${k}_1.log 2>&1; done
timeout 200 python3 $S/diag16.py --tokenizer .ab/tok --rounds 6 --variant no_metadata_cache --out $OUT/r05b_1.json > $OUT/r05b_1.log 2>&1
python3 $S/table.py $OUT/r05b_1.json
for k in free json; do grep -A30 "run 1" $OUT/phases_${k}_1.log | head -24; done
grep -c "rejected sampled" $OUT/*.log; true
