# Nineteenth session, call 5: the engine thread's CPU by phase (diag18.py's --phases) in free,
# constrained and no_grammar_work runs (diag19.py).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
S=benchmarks/results/2026-12-04/s19/scripts
timeout 230 python3 $S/diag19.py --phases --tokenizer .ab/tok --rounds 4 --variant no_grammar_work --out $OUT/p05b_5.json > $OUT/p05b_5.log 2>&1
python3 -c "
import json,sys; d=json.load(open('$OUT/p05b_5.json'))['summary']
for f in ('free','constrained','no_grammar_work'):
    print(f, ' '.join('%s=%.3f'%(k.replace('_ms_per_step',''),v) for k,v in d[f].items() if k.startswith('ph_') or k in ('ms_per_step','engine_cpu_ms_per_step','ratio_median')))
"
