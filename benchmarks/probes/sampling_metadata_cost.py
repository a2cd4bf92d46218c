"""Probe: host µs a step of SamplingMetadata.build against the runner's SamplingMetadataCache.

Host cost of a step's sampling metadata: ``SamplingMetadata.build`` against the runner's
``SamplingMetadataCache`` on the same rows step after step (a steady decode batch).

    python -m benchmarks.probes.sampling_metadata_cost [--rows 256] [--steps 2000] [--device cpu|cuda]

Rows are greedy, or sampled with temperature 0.8 and top-p 0.9; each has a 300-token prompt and
50 output tokens. Prints the median µs a step of each form (host time: on CUDA the tensors'
host-to-device copies are enqueued, not waited for).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from aioinfer import SamplingParams
from aioinfer.sample.sampling_metadata import SamplingMetadata, SamplingMetadataCache, SamplingRow

VOCAB = 151936  # Qwen2.5


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=256)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    device = torch.device(args.device)
    forms = {"greedy": SamplingParams(temperature=0.0), "temperature + top-p": SamplingParams(temperature=0.8, top_p=0.9)}
    print(f"{'rows':>20} {'build us':>9} {'cached us':>10}")
    for name, params in forms.items():
        rows = [SamplingRow(params, [1] * 300, [5] * 50, seed=i, eos_token_ids=(2,)) for i in range(args.rows)]
        cache = SamplingMetadataCache()
        fresh = _median_us(lambda: SamplingMetadata.build(list(rows), VOCAB, device), args.steps)
        cached = _median_us(lambda: cache.build(list(rows), VOCAB, device), args.steps)
        print(f"{name:>20} {fresh:9.1f} {cached:10.1f}")


def _median_us(step, steps: int) -> float:
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return 1e6 * statistics.median(times)


if __name__ == "__main__":
    main()
