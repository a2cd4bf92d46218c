"""Device time and engine-thread CPU of a constrained greedy step's sampling at workload 1's shape
(256 rows, Qwen2.5's 151,936 tokens, bf16 logits, masks allowing ~1 token in 3): the fused kernel
(worker/masked_greedy.py) against apply + float + argmax, and argmax on the bf16 logits (the free
twin) against float + argmax. CUDA events around 200 back-to-back launches each, after a warm-up;
each launch alone (a sync after it) for the CPU side. Prints a table; --out writes JSON."""
import argparse
import json
import time

import torch

from aioinfer.worker.bitmask_apply import apply_bitmask
from aioinfer.worker.masked_greedy import masked_greedy

parser = argparse.ArgumentParser()
parser.add_argument("--out")
args = parser.parse_args()
rows, vocab = 256, 151_936
words = (vocab + 31) // 32
generator = torch.Generator(device="cuda").manual_seed(0)
logits = torch.randn(rows, vocab, device="cuda", generator=generator).to(torch.bfloat16)
bits = torch.randint(-2**31, 2**31 - 1, (rows, words), device="cuda", dtype=torch.int32, generator=generator)
bits &= torch.randint(-2**31, 2**31 - 1, (rows, words), device="cuda", dtype=torch.int32, generator=generator)

forms = {
    "apply + float + argmax": lambda: apply_bitmask(logits.clone(), bits, None).float().argmax(-1),
    "clone alone (the A/B's own copy)": lambda: logits.clone(),
    "masked_greedy": lambda: masked_greedy(logits, bits),
    "float + argmax (free)": lambda: logits.float().argmax(-1),
    "argmax on bf16 (free twin)": lambda: logits.argmax(-1),
}
assert torch.equal(forms["masked_greedy"](), forms["apply + float + argmax"]())
assert torch.equal(forms["argmax on bf16 (free twin)"](), forms["float + argmax (free)"]())
result = {}
for name, form in forms.items():
    for _ in range(20):
        form()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(200):
        form()
    end.record()
    end.synchronize()
    device_ms = start.elapsed_time(end) / 200
    cpu = []
    for _ in range(200):
        torch.cuda.synchronize()
        t = time.thread_time()
        form()
        cpu.append(time.thread_time() - t)
    cpu.sort()
    result[name] = {"device_ms": device_ms, "cpu_us_median": cpu[100] * 1e6}
print(f"{'form':36} {'device ms':>10} {'CPU µs':>8}")
for name, r in result.items():
    print(f"{name:36} {r['device_ms']:10.4f} {r['cpu_us_median']:8.1f}")
if args.out:
    json.dump(result, open(args.out, "w"), indent=1)
