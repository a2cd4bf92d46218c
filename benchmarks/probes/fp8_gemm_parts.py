"""Probe: where an FP8 linear layer's time goes at 7b shapes: bf16 ``F.linear``, aioinfer's FP8 layer, its
per-token quantization kernel, and ``torch._scaled_mm`` with row-wise and tensor-wise scales
(with and without fast accumulation), each timed inside CUDA graphs (GPU, sm_89+).

    python -m benchmarks.probes.fp8_gemm_parts

Each figure is µs per call: 50 calls captured in one graph, replayed 10 times; launch costs are
gone, as in the engine's decode steps. The floor is the FP8 weight read at 3.35 TB/s (the H100's
copy rate). 1-8 rows run the layer's weight-only Triton kernel; more run quantization plus the
row-wise ``_scaled_mm``; the tensor-wise columns use unit scales (the kernel cuBLASLt picks for
per-tensor scaling, as vLLM's online FP8 uses).
"""

from __future__ import annotations

import torch

from aioinfer.layers.linear import MergedLinear
from aioinfer.layers.quantization.config import QuantConfig
from aioinfer.layers.quantization.fp8_linear import Fp8Linear
from aioinfer.layers.triton_ops.fp8_quant import quantize_fp8_rows

SHAPES = {"qkv": (4608, 3584), "gate_up": (37888, 3584), "down": (3584, 18944), "o": (3584, 3584)}  # (N, K)
ROWS = (1, 8, 64, 256)
COPY_RATE = 3.35e12


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


def fp8_layer(n: int, k: int) -> MergedLinear:
    with torch.device("meta"):
        layer = MergedLinear(k, [n]).to(torch.bfloat16)
    layer.quant = Fp8Linear(layer, QuantConfig(source="online"), "probe")
    layer.to_empty(device="cuda")
    layer.weight_loader(layer.weight, torch.randn(n, k, device="cuda") / k**0.5, 0)
    return layer


def main() -> None:
    fp8 = torch.float8_e4m3fn
    print("| matrix | N x K | rows | bf16 F.linear | FP8 layer | quantize | row-wise | row-wise fast | tensor-wise "
          "| tensor-wise fast | floor |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, (n, k) in SHAPES.items():
        layer = fp8_layer(n, k)
        w_bf16 = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        w = layer.weight
        for rows in ROWS:
            x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
            qx = x.to(fp8)
            row_scale, col_scale = torch.ones(rows, 1, device="cuda"), torch.ones(1, n, device="cuda")
            unit = torch.ones((), device="cuda")
            cells = [graph_us(lambda: torch.nn.functional.linear(x, w_bf16)), graph_us(lambda: layer(x)),
                     graph_us(lambda: quantize_fp8_rows(x))]
            for scale_a, scale_b in ((row_scale, col_scale), (unit, unit)):
                for fast in (False, True):
                    cells.append(graph_us(lambda: torch._scaled_mm(qx, w.t(), scale_a=scale_a, scale_b=scale_b,
                                                                   out_dtype=torch.bfloat16, use_fast_accum=fast)))
            floor = n * k / COPY_RATE * 1e6
            print(f"| {name} | {n} x {k} | {rows} | " + " | ".join(f"{c:.1f}" for c in cells) + f" | {floor:.1f} |")


if __name__ == "__main__":
    main()
