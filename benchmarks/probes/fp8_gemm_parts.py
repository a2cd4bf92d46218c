"""Probe: where an FP8 linear layer's time goes at 7b shapes: bf16 ``F.linear``, aioinfer's FP8 layers
(online per-tensor and per-channel), their activation quantization kernels, ``torch._scaled_mm`` with
row-wise and tensor-wise scales, and the weight-only Triton kernel's configurations at one row, each
timed inside CUDA graphs (GPU, sm_89+).

    python -m benchmarks.probes.fp8_gemm_parts [--rows 1,2,4,8,64,256,8192] [--json PATH]

Each figure is µs per call: 50 calls captured in one graph, replayed 10 times; launch costs are
gone, as in the engine's decode steps. The floor is the FP8 weight read at 3.35 TB/s (the H100's
copy rate). The ``_scaled_mm`` columns use unit scales and fast accumulation, as the layers run them.
"""

from __future__ import annotations

import argparse
import json

import torch

from aioinfer.layers.linear import MergedLinear
from aioinfer.layers.quantization.config import QuantConfig
from aioinfer.layers.quantization.fp8_linear import Fp8Linear
from aioinfer.layers.triton_ops.fp8_quant import quantize_fp8_rows, quantize_fp8_tensor
from aioinfer.layers.triton_ops.small_batch_linear import small_batch_linear

SHAPES = {"qkv": (4608, 3584), "gate_up": (37888, 3584), "down": (3584, 18944), "o": (3584, 3584)}  # (N, K)
COPY_RATE = 3.35e12
SWEEP = [(bn, bk, w) for bn in (2, 4, 8) for bk in (1024, 2048, 4096, 8192) for w in (4, 8)]


def graph_us(fn, calls: int = 50, replays: int = 10) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / (calls * replays) * 1e3


def fp8_layer(n: int, k: int, source: str) -> MergedLinear:
    with torch.device("meta"):
        layer = MergedLinear(k, [n]).to(torch.bfloat16)
    config = QuantConfig(source="online", weights="tensor") if source == "online" else QuantConfig(source=source)
    layer.quant = Fp8Linear(layer, config, "probe")
    layer.to_empty(device="cuda")
    layer.weight_loader(layer.weight, torch.randn(n, k, device="cuda") / k**0.5, 0)
    layer.quant.finish(layer)
    return layer


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", default="1,2,4,8,64,256,8192")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    fp8 = torch.float8_e4m3fn
    results: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "parts": [], "sweep": []}
    cols = ["bf16 F.linear", "FP8 online (tensor)", "FP8 channel", "per-token quant", "per-tensor quant",
            "row-wise _scaled_mm", "tensor-wise _scaled_mm"]
    print("| matrix | N x K | rows | " + " | ".join(cols) + " | floor |")
    print("|---|---|---:|" + "---:|" * (len(cols) + 1))
    for name, (n, k) in SHAPES.items():
        online, channel = fp8_layer(n, k, "online"), fp8_layer(n, k, "compressed-tensors")
        w_bf16 = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        w = online.weight
        for rows in (int(r) for r in args.rows.split(",")):
            x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
            qx = x.to(fp8)
            row_scale, col_scale = torch.ones(rows, 1, device="cuda"), torch.ones(1, n, device="cuda")
            unit = torch.ones((), device="cuda")
            cells = [graph_us(lambda: torch.nn.functional.linear(x, w_bf16)), graph_us(lambda: online(x)),
                     graph_us(lambda: channel(x)), graph_us(lambda: quantize_fp8_rows(x)),
                     graph_us(lambda: quantize_fp8_tensor(x))]
            for scale_a, scale_b in ((row_scale, col_scale), (unit, unit)):
                cells.append(graph_us(lambda: torch._scaled_mm(qx, w.t(), scale_a=scale_a, scale_b=scale_b,
                                                               out_dtype=torch.bfloat16, use_fast_accum=True)))
            floor = n * k / COPY_RATE * 1e6
            results["parts"].append({"matrix": name, "n": n, "k": k, "rows": rows, "floor_us": floor,
                                     **{c: round(v, 2) for c, v in zip(cols, cells)}})
            print(f"| {name} | {n} x {k} | {rows} | " + " | ".join(f"{c:.1f}" for c in cells) + f" | {floor:.1f} |",
                  flush=True)
    print("\nweight-only Triton kernel at 1 row, FP8 weights: (BLOCK_N, BLOCK_K, warps) -> µs")
    for name, (n, k) in SHAPES.items():
        layer = fp8_layer(n, k, "online")
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        timed = []
        for config in SWEEP:
            us = graph_us(lambda: small_batch_linear(x, layer.weight, None, weight_scale=layer.weight_scale,
                                                     config=(*config, False)))
            timed.append((us, config))
            results["sweep"].append({"matrix": name, "config": list(config), "us": round(us, 2)})
        timed.sort()
        floor = n * k / COPY_RATE * 1e6
        print(f"{name}: floor {floor:.1f}; best " + ", ".join(f"{c} {us:.1f}" for us, c in timed[:4])
              + f"; default (4, 2048, 4) {next(us for us, c in timed if c == (4, 2048, 4)):.1f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
