# Eighteenth session, call 1: GPU tests of the zero-copy slots; which CPUs interfere (siblings.py);
# the apply's device and launch time; rounds with the copy (s17 path) and the engine thread apart as
# A/B forms; the interference probe at the engine's working-set size.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
S=benchmarks/results/2026-12-04/s18/scripts
lscpu > $OUT/lscpu_1.log 2>&1
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_grammar_mask_copy_gpu.py tests/test_mask_slots.py > $OUT/pytest_1.log 2>&1
tail -1 $OUT/pytest_1.log
timeout 60 python3 $S/siblings.py --out $OUT/siblings_1.json > $OUT/siblings_1.log 2>&1
timeout 30 python3 $S/applytime.py > $OUT/applytime_1.log 2>&1
SIBLINGS=$OUT/siblings_1.json timeout 270 python3 $S/diag18.py --tokenizer .ab/tok --rounds 8 --variant copy --variant apart --out $OUT/r05b_1.json > $OUT/r05b_1.log 2>&1
timeout 50 python3 $S/interfere.py --tokenizer .ab/tok --seconds 4 --threads 4 --objects 40000 --out $OUT/interfere_1.json > $OUT/interfere_1.log 2>&1
python3 benchmarks/results/2026-12-04/s16/scripts/table.py $OUT/r05b_1.json
cat $OUT/siblings_1.log $OUT/applytime_1.log; tail -3 $OUT/interfere_1.log; grep -c "rejected sampled" $OUT/*.log; true
