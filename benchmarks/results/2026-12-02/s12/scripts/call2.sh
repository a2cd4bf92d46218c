python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:.
timeout 540 python3 benchmarks/results/2026-12-02/s12/scripts/probe_rounds.py --tokenizer .ab/tok --rounds 4 --forms free,free_block,cons,cons_long,fake,fake_inline,fake_long --out $OUT/probe2.json > $OUT/probe2.log 2>&1; grep -E "Error|rejected" $OUT/probe2.log | head -5
python3 -c "
import json; d=json.load(open('$OUT/probe2.json'))['summary']
for k,v in d.items(): print(k, {a:b for a,b in v.items() if a not in ('steps','steal_all_cpus')})"
