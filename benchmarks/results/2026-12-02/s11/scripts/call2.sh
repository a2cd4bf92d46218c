python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:.
timeout 500 python3 benchmarks/results/2026-12-02/s11/scripts/handoff_rounds.py --tokenizer .ab/tok --rounds 4 --variant handoff_s10 --variant handoff20 --variant threads8 --out $OUT/handoff.json > $OUT/handoff.log 2>&1; grep -E "round|Error|error" $OUT/handoff.log | tail -30; python3 -c "
import json; d=json.load(open('$OUT/handoff.json'))['summary']
for k,v in d.items():
    if isinstance(v,dict): print(k, {a:(round(b,3) if isinstance(b,float) else b) for a,b in v.items()})"
