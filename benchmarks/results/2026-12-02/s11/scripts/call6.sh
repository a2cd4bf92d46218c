python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:.
timeout 120 python3 -m pytest -q -x tests/test_grammar_mask_copy_gpu.py -p no:cacheprovider > $OUT/gputests.log 2>&1; tail -2 $OUT/gputests.log
timeout 250 python3 benchmarks/results/2026-12-02/s11/scripts/handoff_rounds.py --tokenizer .ab/tok --rounds 6 --variant handoff_s10 --out $OUT/final05b.json > $OUT/final05b.log 2>&1
timeout 200 python3 benchmarks/results/2026-12-02/s11/scripts/handoff_rounds.py --model qwen2.5-7b --tokenizer .ab/tok --rounds 2 --out $OUT/final7b.json > $OUT/final7b.log 2>&1
for f in final05b final7b; do grep -E "^round" $OUT/$f.log; echo "rejections: $(grep -c 'grammar rejected' $OUT/$f.log)"; python3 -c "
import json; d=json.load(open('$OUT/$f.json'))['summary']
for k,v in d.items():
    if isinstance(v,dict): print(k, {a:(round(b,3) if isinstance(b,float) else b) for a,b in v.items()})"; done
