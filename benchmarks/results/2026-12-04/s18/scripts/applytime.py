"""The apply's device time and the engine thread's time to launch it, for 128 and 256 rows of
Qwen2.5's vocabulary: the kernel reading the masks from device rows, from pinned host rows (the
slots' path since the eighteenth session), and the copy it replaced (2.4 MB at 128 rows, on a stream
of its own) — CUDA events over 200 launches, perf_counter for the host side."""
import time

import torch

from aioinfer.worker.bitmask_apply import apply_bitmask_triton

V = 151936
W = (V + 31) // 32


def device_ms(fn, n=200):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    start.record()
    for _ in range(n):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / n


def host_us(fn, n=200):
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    d = time.perf_counter() - t
    torch.cuda.synchronize()
    return 1e6 * d / n


print(f"{'rows':>4} {'dtype':>9} {'dev bits ms':>11} {'host bits ms':>12} {'copy ms':>7} {'launch us':>9}")
for rows in (128, 256):
    for dtype in (torch.float32, torch.bfloat16):
        logits = torch.randn((rows, V), device="cuda").to(dtype)
        host = torch.randint(-2**31, 2**31 - 1, (rows, W), dtype=torch.int32).pin_memory()
        dev = host.cuda()
        copy_stream = torch.cuda.Stream()
        on_dev = device_ms(lambda: apply_bitmask_triton(logits, dev, None))
        on_host = device_ms(lambda: apply_bitmask_triton(logits, host, None))

        def copy():
            dev.copy_(host, non_blocking=True)
        copy_ms = device_ms(copy)
        launch = host_us(lambda: apply_bitmask_triton(logits, host, None))
        print(f"{rows:>4} {str(dtype)[6:]:>9} {on_dev:>11.4f} {on_host:>12.4f} {copy_ms:>7.4f} {launch:>9.1f}")
