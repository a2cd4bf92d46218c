"""Probe: warm versus cold time to first token for a long shared prefix with prefix caching (GPU).

    python -m benchmarks.probes.prefix_cache --model qwen2.5-7b --out results/prefix_cache_7b.json

One engine with ``enable_prefix_caching=True`` (dummy bf16 weights). Each trial draws a fresh random
prefix of ``--prefix-len`` tokens (4096 by default) and two different suffixes of ``--suffix-len``
tokens: the cold request (prefix + suffix A) finds nothing cached, the warm one (prefix + suffix B)
right after it finds the prefix's full blocks cached. Time to first token is the wall time of an
offline ``generate`` of that one prompt with ``max_tokens=1`` (schedule, prefill, sample, output),
device synchronised: no HTTP and no queueing, so the ratio isolates the prefill that caching saves.
A warm-up pair on its own prefix comes first (kernels and allocator for both prompt lengths).
Reported: medians over ``--trials``, the warm / cold ratio (target, issue 5: ≤ 15%) and the cached
tokens each request reported (``RequestOutput.num_cached_tokens``), which shows the hit is real.
``--model tiny --device cpu`` smoke-tests the script (the prefix is clamped to the tiny context).
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from typing import Any

from benchmarks.common import default_device, SHAPES, dump, environment, format_table, make_llm, write_dummy_model
from benchmarks.triton_compiles import TritonCompiles

TARGET_RATIO = 0.15


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=sorted(SHAPES), default="qwen2.5-7b")
    p.add_argument("--prefix-len", type=int, default=4096)
    p.add_argument("--suffix-len", type=int, default=32)
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--attention-backend", default=None)
    p.add_argument("--enforce-eager", choices=("true", "false"), default=None)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--device", default=None, help="cuda (default when present) or cpu (smoke test)")
    p.add_argument("--out", default=None, help="JSON results")
    args = p.parse_args()

    import torch

    from aioinfer import SamplingParams

    device = default_device(args.device)
    shape = SHAPES[args.model]
    prefix_len = min(args.prefix_len, shape.max_position - args.suffix_len - 1)
    if prefix_len != args.prefix_len:
        print(f"note: prefix clamped to {prefix_len} tokens ({args.model}'s context is {shape.max_position})")
    max_model_len = prefix_len + args.suffix_len + 1
    tok_max = min(10000, shape.vocab - 1)
    env = environment()
    print(env, flush=True)

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    with tempfile.TemporaryDirectory() as tmp:
        folder = write_dummy_model(shape, tmp)
        llm, dropped = make_llm(folder, device, None if args.enforce_eager is None else args.enforce_eager == "true",
                                args.attention_backend, max_model_len=max_model_len,
                                max_num_batched_tokens=max(args.max_num_batched_tokens, max_model_len),
                                gpu_memory_utilization=args.gpu_memory_utilization, enable_prefix_caching=True)
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)

    compiled_in_trials: list[str] = []

    def ttft(prompt: list[int]) -> tuple[float, int]:
        sync()
        with TritonCompiles() as compiles:
            start = time.perf_counter()
            (out,) = llm.generate([prompt], params, use_tqdm=False)
            sync()
            seconds = time.perf_counter() - start
        compiled_in_trials.extend(compiles.names or ())
        return seconds, out.num_cached_tokens

    def draw(seed: int) -> tuple[list[int], list[int], list[int]]:
        rng = random.Random(seed)
        prefix = [rng.randint(0, tok_max) for _ in range(prefix_len)]
        return (prefix, [rng.randint(0, tok_max) for _ in range(args.suffix_len)],
                [rng.randint(0, tok_max) for _ in range(args.suffix_len)])

    prefix, a, b = draw(10_000)  # warm-up pair
    ttft(prefix + a)
    ttft(prefix + b)
    compiled_in_trials.clear()

    trials: list[dict[str, Any]] = []
    for trial in range(args.trials):
        prefix, a, b = draw(trial)
        cold_s, cold_cached = ttft(prefix + a)
        warm_s, warm_cached = ttft(prefix + b)
        trials.append({"cold_s": cold_s, "warm_s": warm_s, "cold_cached_tokens": cold_cached,
                       "warm_cached_tokens": warm_cached, "ratio": warm_s / cold_s})
        print(trials[-1], flush=True)
    llm.shutdown()

    cold = statistics.median(t["cold_s"] for t in trials)
    warm = statistics.median(t["warm_s"] for t in trials)
    ratio = warm / cold
    cached = statistics.median(t["warm_cached_tokens"] for t in trials)
    cold_cached = max(t["cold_cached_tokens"] for t in trials)
    payload = {"benchmark": "prefix_cache (warm vs cold TTFT)", "model": args.model, "device": device,
               "environment": env, "prefix_len": prefix_len, "suffix_len": args.suffix_len,
               "cold_s_median": cold, "warm_s_median": warm, "warm_over_cold": ratio, "target_ratio": TARGET_RATIO,
               "trials": trials, "triton_compiles_in_trials": compiled_in_trials, "dropped_options": dropped, "argv": vars(args)}
    dump(args.out, payload)
    print()
    print(f"prefix caching, {args.model} (dummy weights), {env.get('device')}, {env['date']}: prompt = "
          f"{prefix_len}-token shared prefix + {args.suffix_len}-token suffix, max_tokens=1, medians of "
          f"{args.trials} trials; target warm <= {TARGET_RATIO:.0%} of cold")
    print(format_table(["request", "TTFT ms", "cached tokens (median)", "warm / cold", "meets target"], [
        ["cold (new prefix)", cold * 1e3, cold_cached, None, None],
        ["warm (same prefix, new suffix)", warm * 1e3, cached, f"{ratio:.1%}",
         "yes" if ratio <= TARGET_RATIO else "NO"],
    ]))


if __name__ == "__main__":
    main()
