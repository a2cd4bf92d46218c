"""Probe: KV swap bandwidth per direction, the engine's own swap path, in Qwen2.5 KV shapes.

    python -m benchmarks.probes.kv_swap --model qwen2.5-7b --out results/kv_swap_7b.json

For each swap size (``--sizes-mib``, default 16, 64, 256) the engine's ``KVSwapper`` swaps a request
of that many MiB of KV (whole blocks, all layers; block ids drawn at random from the device pool)
out to pinned host memory and back into other random blocks, ``--iters`` times after a warm-up, and
checks once that every byte came back. Reported per direction, medians:
- ``copy GB/s``: the one host copy alone, timed by the engine with cuda-python events on its copy
  stream (what ``aioinfer:kv_swap_bandwidth_gbps`` observes);
- ``swap GB/s``: the whole swap as the step loop sees it on the device: block ids uploaded, the
  per-layer gather (out) or scatter (in), the copy; torch CUDA events on the compute stream around
  ``swap()`` (out: until the copy's end, awaited through the copy stream);
- ``per-block GB/s`` (``--baseline``): one ``cudaMemcpyAsync`` per block, layer, K and V straight
  between the cache and pinned memory, the seed project's way (1.1 GB/s there).
Target (issue 5): ≥ 20 GB/s per direction for swaps of ≥ 64 MiB. ``--model tiny --device cpu``
smoke-tests the script (synchronous host copies, wall-clock timed; never a number to report).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from benchmarks.common import default_device, SHAPES, dump, environment, format_table

TARGET_GBPS = 20.0
TARGET_MIN_MIB = 64


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=sorted(SHAPES), default="qwen2.5-7b")
    p.add_argument("--sizes-mib", default="16,64,256")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--baseline", choices=("true", "false"), default="true", help="time per-block copies too")
    p.add_argument("--device", default=None, help="cuda (default when present) or cpu (smoke test)")
    p.add_argument("--out", default=None, help="JSON results")
    args = p.parse_args()

    import torch

    from aioinfer.core.scheduler_output import SwapIn, SwapOut
    from aioinfer.worker.kv_cache import KVCacheSpec, allocate_kv_caches
    from aioinfer.worker.swap import KVSwapper

    device = torch.device(default_device(args.device))
    cuda = device.type == "cuda"
    shape = SHAPES[args.model]
    spec = KVCacheSpec(num_layers=shape.layers, block_size=args.block_size, num_kv_heads=shape.kv_heads,
                       head_dim=shape.head_dim, dtype=torch.bfloat16 if cuda else torch.float32)
    sizes = [int(s) for s in args.sizes_mib.split(",")]
    blocks_for = {mib: -(-mib * 2**20 // spec.bytes_per_block) for mib in sizes}
    largest = max(blocks_for.values())
    num_device_blocks = 2 * largest + 8  # room to swap back into blocks other than the ones swapped out
    caches = allocate_kv_caches(spec, num_device_blocks, device)
    for pair in caches:
        for t in pair:
            t.copy_(torch.randn(t.shape, dtype=torch.float32, device=device).to(t.dtype))
    swapper = KVSwapper(caches, spec, largest + 3, device)
    env = environment()
    print(f"{env}\n{args.model} KV: {spec.num_layers} layers x {spec.num_kv_heads} KV heads x {spec.head_dim}, "
          f"block {spec.block_size} tokens = {spec.bytes_per_block / 2**20:.3f} MiB per block ({spec.dtype}); "
          f"timer: {swapper.timer_backend}", flush=True)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    rng = random.Random(0)
    rows, results = [], []
    for mib in sizes:
        n = blocks_for[mib]
        nbytes = n * spec.bytes_per_block
        copy_s: dict[str, list[float]] = {"out": [], "in": []}
        swap_s: dict[str, list[float]] = {"out": [], "in": []}
        for it in range(args.iters + 1):  # the first is a warm-up
            src = tuple(rng.sample(range(num_device_blocks), n))
            taken = set(src)
            rest = [b for b in range(num_device_blocks) if b not in taken]
            dst = tuple(rng.sample(rest, n))
            expected = [t.index_select(0, torch.tensor(src, device=device)).clone() for pair in caches for t in pair]
            swapper.synchronize()
            swapper.take_timings()
            sync()
            out_s = _timed(lambda: swapper.swap([SwapOut("r", src, 3)], []), swapper, cuda)
            in_s = _timed(lambda: swapper.swap([], [SwapIn("r", 3, dst)]), swapper, cuda)
            swapper.synchronize()
            timings = swapper.take_timings()
            assert [t.direction for t in timings] == ["out", "in"], timings
            if it == 0:
                got = [t.index_select(0, torch.tensor(dst, device=device)) for pair in caches for t in pair]
                assert all(torch.equal(a, b) for a, b in zip(got, expected)), "swap round trip corrupted KV"
                continue
            for t in timings:
                copy_s[t.direction].append(t.seconds)
            swap_s["out"].append(out_s)
            swap_s["in"].append(in_s)
        baseline = _per_block_baseline(caches, swapper.host, n, num_device_blocks, cuda, rng) \
            if args.baseline == "true" else None
        for direction in ("out", "in"):
            copy_med = statistics.median(copy_s[direction])
            swap_med = statistics.median(swap_s[direction])
            base = baseline[direction] if baseline else None
            entry = {"size_mib": mib, "blocks": n, "bytes": nbytes, "direction": direction,
                     "copy_s_median": copy_med, "copy_gbps": nbytes / copy_med / 1e9,
                     "swap_s_median": swap_med, "swap_gbps": nbytes / swap_med / 1e9,
                     "per_block_s": base, "per_block_gbps": nbytes / base / 1e9 if base else None,
                     "copy_s_all": copy_s[direction], "swap_s_all": swap_s[direction]}
            results.append(entry)
            meets = None
            if mib >= TARGET_MIN_MIB:
                meets = "yes" if entry["copy_gbps"] >= TARGET_GBPS and entry["swap_gbps"] >= TARGET_GBPS else "NO"
            rows.append([mib, n, direction, copy_med * 1e3, entry["copy_gbps"], swap_med * 1e3, entry["swap_gbps"],
                         entry["per_block_gbps"], meets])
            print(rows[-1], flush=True)
    swapper.close()

    payload = {"benchmark": "kv_swap", "model": args.model, "device": str(device), "environment": env,
               "spec": {"num_layers": spec.num_layers, "block_size": spec.block_size,
                        "num_kv_heads": spec.num_kv_heads, "head_dim": spec.head_dim, "dtype": str(spec.dtype),
                        "bytes_per_block": spec.bytes_per_block},
               "timer": swapper.timer_backend, "iters": args.iters, "target_gbps": TARGET_GBPS,
               "results": results, "argv": vars(args)}
    dump(args.out, payload)
    print()
    print(f"KV swap, {args.model} shapes ({spec.dtype}), {env.get('device')}, {env['date']}; medians of {args.iters}; "
          f"copy timed by {swapper.timer_backend}; target >= {TARGET_GBPS:.0f} GB/s for >= {TARGET_MIN_MIB} MiB")
    print(format_table(["MiB", "blocks", "direction", "copy ms", "copy GB/s", "swap ms", "swap GB/s",
                        "per-block GB/s", "meets target"], rows))


def _timed(fn, swapper, cuda: bool) -> float:
    """Seconds of one swap on the device: from before its first kernel to the end of its copy (out) or
    scatter (in), with CUDA events on the compute stream; wall clock on CPU (the copies are synchronous)."""
    import torch

    if not cuda:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    # The swap-out copy runs on the copy stream: make the compute stream wait for it, then mark the end.
    torch.cuda.current_stream().wait_stream(swapper.stream)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def _per_block_baseline(caches, host, n: int, num_device_blocks: int, cuda: bool, rng) -> dict[str, float]:
    """The seed project's way: a copy per block, layer and K/V between the cache and pinned memory."""
    import torch

    src = rng.sample(range(num_device_blocks), n)
    seconds = {}
    for direction in ("out", "in"):
        def run() -> None:
            for i, block in enumerate(src):
                for layer, (keys, values) in enumerate(caches):
                    if direction == "out":
                        host[i, layer, 0].copy_(keys[block], non_blocking=True)
                        host[i, layer, 1].copy_(values[block], non_blocking=True)
                    else:
                        keys[block].copy_(host[i, layer, 0], non_blocking=True)
                        values[block].copy_(host[i, layer, 1], non_blocking=True)
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        run()
        if cuda:
            torch.cuda.synchronize()
        seconds[direction] = time.perf_counter() - t0
    return seconds


if __name__ == "__main__":
    main()
