python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:.
S=benchmarks/results/2026-12-03/s13/scripts
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_grammar_mask_copy_gpu.py tests/test_grammar_worker.py::test_the_thread_ends_on_close_and_when_dropped > $OUT/pytest.log 2>&1; tail -3 $OUT/pytest.log
timeout 300 python3 $S/ab_rounds.py --tokenizer .ab/tok --rounds 6 --variant legacy --variant consume_inline --variant no_poll --out $OUT/ab05b.json > $OUT/ab05b.log 2>&1; grep -E "^round|Error|rejected" $OUT/ab05b.log | cut -c1-220 | tail -40
python3 -c "
import json; d=json.load(open('$OUT/ab05b.json'))['summary']
for k,v in d.items(): print(k, v)"
for k in free json; do timeout 120 python3 -m benchmarks.structured_output_phases --kind $k --tokenizer .ab/tok --repeats 2 > $OUT/phases_$k.log 2>&1; done; tail -25 $OUT/phases_free.log $OUT/phases_json.log | cut -c1-160
