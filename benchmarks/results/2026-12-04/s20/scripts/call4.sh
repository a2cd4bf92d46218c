# Twentieth session, call 4: the apply's launch each alone against back to back, in three forms
# (applycpu20.py); then the engine thread's CPU by phase (diag18.py's --phases) in free, constrained
# (the copy to device rows) and no_grammar_work runs.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
S=benchmarks/results/2026-12-04/s20/scripts
timeout 90 python3 $S/applycpu20.py $OUT/applycpu_4.json > $OUT/applycpu_4.log 2>&1; tail -5 $OUT/applycpu_4.log
timeout 300 python3 $S/diag20.py --phases --tokenizer .ab/tok --rounds 5 --variant no_grammar_work --out $OUT/p05b_4.json > $OUT/p05b_4.log 2>&1
python3 -c "
import json,sys; d=json.load(open('$OUT/p05b_4.json'))['summary']
for f in ('free','constrained','no_grammar_work'):
    print(f, ' '.join('%s=%.3f'%(k.replace('_ms_per_step',''),v) for k,v in d[f].items() if k.startswith('ph_') or k in ('ms_per_step','engine_cpu_ms_per_step','ratio_median')))
"
