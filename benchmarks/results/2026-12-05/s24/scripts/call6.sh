# Twenty-fourth session, call 6: the fused masked greedy's engine test with n-gram speculation too
# (grammar masks on verification rows). Carry .whl.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_masked_greedy.py > $OUT/pytest_6.log 2>&1
tail -3 $OUT/pytest_6.log
