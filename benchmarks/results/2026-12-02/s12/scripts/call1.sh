python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:.
nproc; lscpu | grep -E "Model name|Thread|Core|Socket|MHz" | head
timeout 540 python3 benchmarks/results/2026-12-02/s12/scripts/probe_rounds.py --tokenizer .ab/tok --rounds 4 --out $OUT/probe.json > $OUT/probe.log 2>&1; grep -E "^round|busy loop|Error" $OUT/probe.log | cut -c1-400
python3 -c "
import json; d=json.load(open('$OUT/probe.json'))['summary']
for k,v in d.items(): print(k, v)"
