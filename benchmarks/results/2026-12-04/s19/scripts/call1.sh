# Nineteenth session, call 1: what a GIL turn costs on this host (turns.py), Triton's compiled
# launch path (source), then rounds of the landed tree against the turns' variants (diag19.py).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
S=benchmarks/results/2026-12-04/s19/scripts
nproc; python3 $S/turns.py $OUT/turns_1.json | tr -d '\n '; echo
python3 - > $OUT/triton_launch_src.txt 2>&1 <<'PY'
import inspect, triton
from triton.compiler.compiler import CompiledKernel
print(triton.__version__)
print(inspect.getsource(CompiledKernel))
from triton.backends.nvidia import driver
print(inspect.getsource(driver.CudaLauncher))
PY
timeout 330 python3 $S/diag19.py --tokenizer .ab/tok --rounds 6 --variant engine_consume --variant inline --variant switch_5us --variant switch_default --out $OUT/r05b_1.json > $OUT/r05b_1.log 2>&1
python3 benchmarks/results/2026-12-04/s16/scripts/table.py $OUT/r05b_1.json
grep -c "rejected sampled" $OUT/*.log; true
