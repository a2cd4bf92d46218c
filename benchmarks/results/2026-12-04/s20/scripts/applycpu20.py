"""Twentieth session: what the apply's launch costs the engine thread, each launch alone (a sync after
every launch, so the launch queue is empty), against the nineteenth session's back-to-back figure
(3,000 launches in a row: the host may wait for room in the queue, which the device's pace sets).
Forms: the masks in pinned host rows given as a tensor (the launcher asks the driver for the pointer),
the same rows given as their device address (an integer, taken as it is), and device rows; plus the
device time of one apply in each form (CUDA events over 200 launches). 128 rows of Qwen2.5's vocabulary."""
import json
import sys
import time

import torch
from cuda.bindings import runtime as rt

from aioinfer.worker import bitmask_apply

N, V, BLOCK = 128, 151936, 2048
W = (V + 31) // 32
logits = torch.randn(N, V, device="cuda", dtype=torch.bfloat16)
host = torch.full((N, W), -1, dtype=torch.int32, pin_memory=True)
device_rows = host.cuda()
error, attributes = rt.cudaPointerGetAttributes(host.data_ptr())
address = int(attributes.devicePointer)
grid = (N, (V + BLOCK - 1) // BLOCK, 1)
bitmask_apply.apply_bitmask(logits, host, None)  # compiles the kernel (one key for both tensor forms)
bitmask_apply.apply_bitmask(logits, host, None)
kept = bitmask_apply._get_kernel()._compiled
compiled = next(iter(kept.values()))
stream = torch.cuda.current_stream().cuda_stream


def host_tensor():
    bitmask_apply.apply_bitmask(logits, host, None)


def host_address():
    compiled[grid](logits, address, address, V, logits.stride(0), W, False, BLOCK, stream=stream)


def device_tensor():
    bitmask_apply.apply_bitmask(logits, device_rows, None)


def alone_us(fn, n=600):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    total = 0
    for _ in range(n):
        start = time.thread_time_ns()
        fn()
        total += time.thread_time_ns() - start
        torch.cuda.synchronize()
    return total / n / 1e3


def back_to_back_us(fn, n=3000):
    torch.cuda.synchronize()
    start = time.thread_time()
    for _ in range(n):
        fn()
    cpu = time.thread_time() - start
    torch.cuda.synchronize()
    return cpu / n * 1e6


def device_ms(fn, n=200):
    torch.cuda.synchronize()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(n):
        fn()
    end.record()
    end.synchronize()
    return begin.elapsed_time(end) / n


forms = {"host_rows_tensor": host_tensor, "host_rows_address": host_address, "device_rows": device_tensor}
out = {}
for name, fn in forms.items():
    out[name] = {"alone_us": min(alone_us(fn) for _ in range(3)),
                 "back_to_back_us": min(back_to_back_us(fn) for _ in range(3)),
                 "device_ms": min(device_ms(fn) for _ in range(3))}
print(f"{'form':>18} {'alone µs':>9} {'b2b µs':>8} {'device ms':>9}")
for name, v in out.items():
    print(f"{name:>18} {v['alone_us']:9.1f} {v['back_to_back_us']:8.1f} {v['device_ms']:9.4f}")
if len(sys.argv) > 1:
    json.dump(out, open(sys.argv[1], "w"), indent=1)
