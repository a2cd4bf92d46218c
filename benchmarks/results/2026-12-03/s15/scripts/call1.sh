python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:.
S=benchmarks/results/2026-12-03/s15/scripts
python3 -c "import cuda.bindings, triton, torch, sys; print('cuda-python', cuda.bindings.__version__, 'triton', triton.__version__, 'torch', torch.__version__, sys.version.split()[0])"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_grammar_mask_copy_gpu.py tests/test_structured_outputs_gpu.py > $OUT/pytest1.log 2>&1; tail -1 $OUT/pytest1.log
timeout 380 python3 $S/diag.py --tokenizer .ab/tok --rounds 8 --variant plumbing_only --out $OUT/r05b_1.json > $OUT/r05b_1.log 2>&1
grep "^round" $OUT/r05b_1.log | cut -c1-120
python3 $S/table.py $OUT/r05b_1.json
grep -c "rejected sampled" $OUT/*.log; true
