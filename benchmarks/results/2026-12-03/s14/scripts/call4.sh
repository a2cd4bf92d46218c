python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:.
S=benchmarks/results/2026-12-03/s14/scripts
timeout 330 python3 $S/probe.py --tokenizer .ab/tok --rounds 6 --variant plumbing_only --variant interval_20us --variant interval_200us --out $OUT/probe05b_4.json > $OUT/probe05b_4.log 2>&1
tail -3 $OUT/probe05b_4.log | cut -c1-200
python3 -c "
import json,statistics as st; d=json.load(open('$OUT/probe05b_4.json'))
for k,v in d['summary'].items(): print(k, {a:(round(b,3) if isinstance(b,float) else b) for a,b in v.items() if a!='copy_start_ms_per_step'} if isinstance(v,dict) else v)
for fm in ['free','constrained','plumbing_only','interval_20us','interval_200us']:
    rs=[r for r in d['runs'] if r['form']==fm]; print(fm,'offcpu',round(st.median(r['ms_per_step']-r['engine_cpu_ms_per_step'] for r in rs),3))"
grep -c "rejected sampled" $OUT/*.log; true
