# Twenty-fourth session, call 4: the fused masked greedy and the raw-logits argmax on by default.
# Every GPU test file, then workload 1 on the 0.5b shape: the landed tree beside three_launches.
# (call 3 stopped at tests/test_structured_outputs_gpu.py: the image has no jsonschema; left out here.)
# Carry .whl and .ab/tok.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
S=benchmarks/results/2026-12-05/s24/scripts
timeout 270 python3 -m pytest -q -p no:cacheprovider tests/test_masked_greedy.py tests/test_sampler.py tests/test_gpu_engine.py tests/test_spec_decode_gpu.py tests/test_grammar_mask_copy_gpu.py tests/test_triton_launch_gpu.py tests/test_prompt_logprobs.py tests/test_swap_gpu.py tests/test_fused_ops.py tests/test_triton_attention.py tests/test_small_batch_linear.py tests/test_data_parallel_gpu.py > $OUT/pytest_4.log 2>&1
tail -3 $OUT/pytest_4.log
timeout 260 python3 $S/diag24.py --tokenizer .ab/tok --rounds 8 --variant three_launches --out $OUT/r05b_4.json > $OUT/r05b_4.log 2>&1; tail -3 $OUT/r05b_4.log
python3 benchmarks/results/2026-12-04/s16/scripts/table.py $OUT/r05b_4.json
grep -c "rejected sampled" $OUT/*.log; true
