"""Probe: cuBLAS against the Triton small-batch linear kernel on the model's projections, configs swept (GPU).

Small-batch projections on the GPU: cuBLAS against the Triton kernel of
aioinfer/layers/triton_ops/small_batch_linear.py.

    python -m benchmarks.probes.gemv_sweep --model qwen2.5-7b --rows 1,2,4,8 --out gemv_7b.json

1. Config sweep (PROLOGUE_NONE, rows 1): (BLOCK_N, BLOCK_K, num_warps) for each projection shape of
   the model at tensor-parallel sizes 1 and 2, against F.linear.
2. A decoder's projections as decode runs them, every layer with its own weights (so nothing
   stays in L2), captured in one CUDA graph per variant: add+rmsnorm kernel, qkv (+bias), o,
   add+rmsnorm, gate_up, silu_and_mul kernel, down, with the products on cuBLAS (F.linear) or on
   the small-batch kernel with its default config (what the layers run).
   Reports microseconds per layer and the bandwidth achieved on the weight bytes.

Kernel times come from replaying CUDA graphs of many calls (weights rotated over enough copies to
exceed the L2), timed with CUDA events; median of 5 replays.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any, Callable

from benchmarks.common import SHAPES, dump, environment, format_table, measure_copy_bandwidth

L2_BYTES = 60 << 20  # H200: 50 MiB L2; rotate over more than 4x this


def _graph_time_us(fn: Callable[[int], None], calls: int) -> float:
    """Median microseconds per call of fn(i) for i in range(calls), captured in one CUDA graph."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(min(calls, 3)):
            fn(i)  # compile / warm up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for i in range(calls):
            fn(i)
    times = []
    for _ in range(6):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(times[1:])


def projection_shapes(shape, tp: int) -> dict[str, tuple[int, int]]:
    """name -> (N, K) of one rank's weight."""
    h, q, kv, inter = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim, shape.intermediate
    return {"qkv": ((q + 2 * kv) // tp, h), "o": (h, q // tp), "gate_up": (2 * inter // tp, h),
            "down": (h, inter // tp)}


def sweep(shape, tps, rows: int, configs) -> list[dict[str, Any]]:
    import torch
    import torch.nn.functional as F

    from aioinfer.layers.triton_ops.small_batch_linear import default_config, small_batch_linear

    out = []
    for tp in tps:
        for name, (n, k) in projection_shapes(shape, tp).items():
            nbytes = 2 * n * k
            copies = max(2, -(-4 * L2_BYTES // nbytes))
            ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5 for _ in range(copies)]
            x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
            calls = max(copies, 32)
            cublas = _graph_time_us(lambda i: F.linear(x, ws[i % copies]), calls)
            row = {"rows": rows, "tp": tp, "proj": name, "N": n, "K": k, "MB": nbytes / 1e6, "cublas_us": cublas,
                   "cublas_TBps": nbytes / cublas / 1e6, "configs": {}}
            for cfg in configs:
                try:
                    t = _graph_time_us(lambda i, cfg=cfg: small_batch_linear(x, ws[i % copies], config=cfg), calls)
                except Exception as e:  # noqa: BLE001 - a config that does not compile is just skipped
                    row["configs"][str(cfg)] = repr(e)[:80]
                    continue
                row["configs"][str(cfg)] = t
            timed = {c: t for c, t in row["configs"].items() if isinstance(t, float)}
            best = min(timed, key=timed.get)
            row.update(best=best, best_us=timed[best], best_TBps=nbytes / timed[best] / 1e6,
                       default=str(default_config(rows, n, k)), default_us=timed.get(str(default_config(rows, n, k))))
            print(f"rows={rows} tp={tp} {name:8s} N={n:6d} K={k:6d} cuBLAS {cublas:7.2f} us ({row['cublas_TBps']:.2f} TB/s)  "
                  f"best {best} {timed[best]:7.2f} us ({row['best_TBps']:.2f} TB/s)  default {row['default_us']}",
                  flush=True)
            out.append(row)
            ws.clear()
    return out


def layer_stack(shape, tp: int, rows: int, configs: dict[str, Any]) -> dict[str, Any]:
    """configs: projection name -> (BLOCK_N, BLOCK_K, num_warps) or None (the kernel's default)."""
    import torch
    import torch.nn.functional as F

    from aioinfer.layers.triton_ops import fused_ops
    from aioinfer.layers.triton_ops import small_batch_linear as sbl

    ops = fused_ops()
    p = projection_shapes(shape, tp)
    dt, dev, h = torch.bfloat16, "cuda", shape.hidden
    layers = []
    for _ in range(shape.layers):
        layers.append({name: torch.randn(n, k, device=dev, dtype=dt) / k**0.5 for name, (n, k) in p.items()}
                      | {"bias": torch.randn(p["qkv"][0], device=dev, dtype=dt), "n1": torch.ones(h, device=dev, dtype=dt),
                         "n2": torch.ones(h, device=dev, dtype=dt)})
    weight_bytes = sum(2 * n * k for n, k in p.values()) * shape.layers
    hidden = torch.randn(rows, h, device=dev, dtype=dt)
    residual = torch.randn(rows, h, device=dev, dtype=dt)
    q_size = p["o"][1]

    def unfused(_i):
        x, r = hidden, residual
        for w in layers:
            y, r = ops.fused_add_rms_norm(x, r, w["n1"], 1e-6)
            qkv = F.linear(y, w["qkv"], w["bias"])
            x = F.linear(qkv[:, :q_size], w["o"])
            y, r = ops.fused_add_rms_norm(x, r, w["n2"], 1e-6)
            x = F.linear(ops.silu_and_mul(F.linear(y, w["gate_up"])), w["down"])

    def triton(_i):  # the same with the small-batch kernel for the four projections
        x, r = hidden, residual
        for w in layers:
            y, r = ops.fused_add_rms_norm(x, r, w["n1"], 1e-6)
            qkv = sbl.small_batch_linear(y, w["qkv"], w["bias"], config=configs.get("qkv"))
            x = sbl.small_batch_linear(qkv[:, :q_size], w["o"], config=configs.get("o"))
            y, r = ops.fused_add_rms_norm(x, r, w["n2"], 1e-6)
            gu = sbl.small_batch_linear(y, w["gate_up"], config=configs.get("gate_up"))
            x = sbl.small_batch_linear(ops.silu_and_mul(gu), w["down"], config=configs.get("down"))

    res = {}
    for name, fn in (("cublas", unfused), ("triton", triton)):
        us = _graph_time_us(fn, 1)
        res[name] = {"us_per_layer": us / shape.layers, "TBps": weight_bytes / us / 1e6}
    layers.clear()
    torch.cuda.empty_cache()
    return {"tp": tp, "rows": rows, "weight_GB": weight_bytes / 1e9, **res}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=sorted(SHAPES), default="qwen2.5-7b")
    p.add_argument("--rows", default="1,2,4,8")
    p.add_argument("--tp", default="1,2", help="tensor-parallel sizes whose per-rank shapes to time")
    p.add_argument("--no-sweep", action="store_true")
    p.add_argument("--sweep-rows", default="1", help="input rows of the config sweep, comma separated")
    p.add_argument("--configs", default="1,1024,1;1,2048,1;2,1024,1;2,1024,2;2,2048,1;2,2048,2;4,1024,1;4,1024,2;"
                   "4,2048,2;4,2048,4;8,512,2;8,1024,2;16,512,2;4,4096,4;2,4096,2",
                   help="BLOCK_N,BLOCK_K,num_warps[,1 = tensor cores];... for the sweep")
    p.add_argument("--out", default=None)
    args = p.parse_args()

    shape = SHAPES[args.model]
    tps = [int(x) for x in args.tp.split(",")]
    rows = [int(x) for x in args.rows.split(",")]
    copy = measure_copy_bandwidth()
    print(f"copy bandwidth {copy / 1e12:.2f} TB/s", flush=True)
    configs = [tuple(int(v) for v in c.split(","))[:3] + tuple(bool(int(v)) for v in c.split(",")[3:])
               for c in args.configs.split(";") if c]
    sweeps = [] if args.no_sweep else [
        row for r in (int(x) for x in args.sweep_rows.split(",")) for row in sweep(shape, tps, r, configs)]
    stacks = [layer_stack(shape, tp, r, {}) for tp in tps for r in rows]
    dump(args.out, {"benchmark": "gemv_sweep", "model": args.model, "environment": environment(),
                    "copy_bytes_per_s": copy, "sweep_rows1": sweeps, "layer_stack": stacks, "argv": vars(args)})
    if sweeps:
        print(format_table(["rows", "tp", "proj", "N", "K", "cuBLAS us", "cuBLAS TB/s", "best config", "best us", "best TB/s",
                            "default us"],
                           [[s["rows"], s["tp"], s["proj"], s["N"], s["K"], s["cublas_us"], s["cublas_TBps"], s["best"], s["best_us"],
                             s["best_TBps"], s["default_us"]] for s in sweeps]))
    print(format_table(["tp", "rows", "cuBLAS us/layer", "kernel us/layer", "kernel/cuBLAS", "cuBLAS TB/s",
                        "kernel TB/s"],
                       [[s["tp"], s["rows"], s["cublas"]["us_per_layer"], s["triton"]["us_per_layer"],
                         s["triton"]["us_per_layer"] / s["cublas"]["us_per_layer"], s["cublas"]["TBps"],
                         s["triton"]["TBps"]] for s in stacks]))


if __name__ == "__main__":
    main()
