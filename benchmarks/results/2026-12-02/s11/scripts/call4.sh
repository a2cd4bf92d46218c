python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:.
python3 -c "import cuda.bindings, llguidance; print('cuda-python', cuda.bindings.__version__)"
timeout 200 python3 -m pytest -q -x tests/test_grammar_mask_copy_gpu.py -p no:cacheprovider > $OUT/gputests.log 2>&1; tail -3 $OUT/gputests.log
timeout 330 python3 benchmarks/results/2026-12-02/s11/scripts/ring_rounds.py --tokenizer .ab/tok --rounds 7 --variant ring_torch --variant torch_copy --out $OUT/ring.json > $OUT/ring.log 2>&1; grep -E "round|Error|error" $OUT/ring.log | tail -30; python3 -c "
import json; d=json.load(open('$OUT/ring.json'))['summary']
for k,v in d.items():
    if isinstance(v,dict): print(k, {a:(round(b,3) if isinstance(b,float) else b) for a,b in v.items()})"
