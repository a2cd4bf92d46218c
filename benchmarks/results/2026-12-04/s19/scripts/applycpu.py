"""Nineteenth session: the engine thread's CPU for one structured-output apply (worker/bitmask_apply.py)
on this host, and where it goes: 128 rows of Qwen2.5's vocabulary, the masks read from pinned host
rows (as the slots' are) and from device rows; a torch argmax over the same logits for scale; then a
cProfile of the host-rows form. Where the tree has it (after call 6), the host rows read at the
slot's address too (``apply_host_rows_address_us``: the launcher given the address, not the tensor)."""
import cProfile
import io
import json
import pstats
import sys
import time

import torch

from aioinfer.worker.bitmask_apply import apply_bitmask

N, V = 128, 151936
W = (V + 31) // 32
logits = torch.randn(N, V, device="cuda", dtype=torch.bfloat16)
host_bits = torch.full((N, W), -1, dtype=torch.int32, pin_memory=True)
device_bits = host_bits.cuda()


def per_call_us(fn, n=3000):
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    c = time.thread_time()
    for _ in range(n):
        fn()
    cpu = time.thread_time() - c
    torch.cuda.synchronize()
    return cpu / n * 1e6


out = {}
try:
    from aioinfer.utils.triton_launch import DeviceAddress  # noqa: F401  (the tree after call 6)
    from aioinfer.worker.mask_slots import MaskSlots
    slots = MaskSlots(W, torch.device("cuda"), N, read_host_rows=True)
    slot = slots.take(N)
    slot.host.fill_(-1)
    out["apply_host_rows_address_us"] = min(
        per_call_us(lambda: apply_bitmask(logits, slot.host, None, slot.address)) for _ in range(3))
except ImportError:
    pass
out = {**out, "apply_host_rows_us": min(per_call_us(lambda: apply_bitmask(logits, host_bits, None)) for _ in range(3)),
       "apply_device_rows_us": min(per_call_us(lambda: apply_bitmask(logits, device_bits, None)) for _ in range(3)),
       "torch_argmax_us": min(per_call_us(lambda: logits.argmax(dim=-1)) for _ in range(3))}
prof = cProfile.Profile()
prof.enable()
for _ in range(3000):
    apply_bitmask(logits, host_bits, None)
prof.disable()
torch.cuda.synchronize()
s = io.StringIO()
pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(14)
print(json.dumps(out, indent=1))
print(s.getvalue())
if len(sys.argv) > 1:
    json.dump(out, open(sys.argv[1], "w"), indent=1)
