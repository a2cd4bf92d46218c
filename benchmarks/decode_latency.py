"""Workload 2 (decode latency): batch 1 / 8 / 64, prompt 128, 256 new tokens; ms per output token.

    python -m benchmarks.decode_latency --model qwen2.5-0.5b --out results/w2.json

Through the public ``LLM`` API: for each batch, T(1) = time of a run with max_tokens=1 (prefill and
first token) and T(256) = time of the full run; TPOT = (T(256) - T(1)) / 255, the median of
``--repeats`` runs each. The floor per step is the decode step floor of common.py (weights + KV
read over the measured copy rate, or the matrix work over the matrix rate), averaged over the 255
steps. ``--hf-peer`` adds transformers' ``generate`` (sdpa, static batch) measured the same way
(with ``--hf-new-tokens`` tokens, as it is slow). ``--vllm`` adds vLLM's offline ``LLM``, timed the same
way in its own process (vllm_peer.py).
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import tempfile
import time
from typing import Any

from benchmarks.common import (default_device, SHAPES, add_engine_options, ceilings, decode_step_floor_s, dump, engine_options,
                               format_options, with_formats,
                               environment, format_table, fresh_cache_salt, make_llm, workload2,
                               write_dummy_model)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=sorted(SHAPES), default="qwen2.5-0.5b")
    p.add_argument("--batches", default="1,8,64")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--attention-backend", default=None)
    p.add_argument("--enforce-eager", choices=("true", "false"), default=None)
    p.add_argument("--async-scheduling", choices=("true", "false"), default=None)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.5,
                   help="leaves room for the HF peer in the same process")
    p.add_argument("--hf-peer", action="store_true", help="also time transformers' generate")
    p.add_argument("--hf-new-tokens", type=int, default=64)
    p.add_argument("--vllm", action="store_true", help="also vLLM's offline LLM (its own process)")
    p.add_argument("--vllm-pythonpath", default=os.environ.get("VLLM_PYTHONPATH"),
                   help="vLLM's child's PYTHONPATH alone (e.g. /tmp/vllm-site); default: $VLLM_PYTHONPATH")
    p.add_argument("--vllm-timeout", type=float, default=600)
    p.add_argument("--device", default=None)
    p.add_argument("--tensor-parallel-size", type=int, default=1, help="GPUs (ranks) the model is split over")
    p.add_argument("--out", default=None)
    add_engine_options(p)
    args = p.parse_args()

    import torch

    device = default_device(args.device)
    shape = with_formats(SHAPES[args.model], args)
    batches = [int(b) for b in args.batches.split(",")]
    tok_max = min(10000, shape.vocab - 1)
    env = environment()
    ceil = ceilings(device == "cuda")
    print(f"{env}\nceilings: copy {ceil['copy_bytes_per_s'] / 1e12:.2f} TB/s, "
          f"bf16 matmul {ceil['matmul_flop_per_s'] / 1e12:.0f} TFLOP/s ({ceil['ceilings_source']})", flush=True)

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_dummy_model(shape, tmp)
        from aioinfer import SamplingParams

        t0 = time.perf_counter()
        llm, dropped = make_llm(folder, device, None if args.enforce_eager is None else args.enforce_eager == "true",
                                args.attention_backend, max_model_len=args.prompt_len + args.new_tokens + 16,
                                max_num_seqs=max(batches), gpu_memory_utilization=args.gpu_memory_utilization,
                                tensor_parallel_size=args.tensor_parallel_size, **engine_options(args),
                                **({} if args.async_scheduling is None
                                   else {"async_scheduling": args.async_scheduling == "true"}))
        init_s = time.perf_counter() - t0

        def timed(prompts, max_tokens: int) -> float:
            params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0)
            sync()
            start = time.perf_counter()
            outs = llm.generate(prompts, params, use_tqdm=False, cache_salt=fresh_cache_salt())
            sync()
            seconds = time.perf_counter() - start
            assert all(len(o.outputs[0].token_ids) == max_tokens for o in outs)
            return seconds

        for batch in batches:
            prompts = [r.prompt for r in workload2(batch, args.prompt_len, args.new_tokens, max_token_id=tok_max)]
            timed(prompts, 8)  # warm-up for this batch size (kernels, graphs)
            t1 = statistics.median(timed(prompts, 1) for _ in range(args.repeats))
            tn = statistics.median(timed(prompts, args.new_tokens) for _ in range(args.repeats))
            tpot = (tn - t1) / (args.new_tokens - 1)
            floor = statistics.fmean(
                decode_step_floor_s(shape, [args.prompt_len + t] * batch, ceil["copy_bytes_per_s"],
                                    ceil["matmul_flop_per_s"]) for t in range(1, args.new_tokens))
            row = {"system": "aioinfer", "tp": args.tensor_parallel_size,
                   "cuda_graphs": getattr(llm.engine.executor.runner, "graphs", None) is not None, "batch": batch, "t_first_s": t1, "t_total_s": tn, "tpot_ms": tpot * 1e3,
                   "floor_ms": floor * 1e3, "over_floor": tpot / floor, "tok_per_s": batch / tpot}
            results.append(row)
            print(row, flush=True)
        llm.shutdown()  # tensor parallel: stop the worker processes (their GPUs too)
        del llm
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()

        if args.vllm:
            from benchmarks import vllm_peer

            theirs = vllm_peer.run("decode", str(folder), args.vllm_pythonpath, args.vllm_timeout, batches=batches,
                                   prompt_len=args.prompt_len, new_tokens=args.new_tokens, repeats=args.repeats,
                                   max_token_id=tok_max, gpu_memory_utilization=args.gpu_memory_utilization,
                                   llm_options=format_options(args))
            for row in theirs.get("results", []):
                ours = next(r for r in results if r["system"] == "aioinfer" and r["batch"] == row["batch"])
                row.update(floor_ms=ours["floor_ms"], over_floor=row["tpot_ms"] / ours["floor_ms"],
                           aioinfer_over_vllm_tpot=ours["tpot_ms"] / row["tpot_ms"])
                results.append(row)
                print(row, flush=True)
            if "error" in theirs:
                print(f"vllm: {theirs['error']}", flush=True)

        if args.hf_peer:
            from benchmarks.offline_throughput import _load_hf

            model = _load_hf(str(folder), device, "sdpa")
            n_new = args.hf_new_tokens

            def hf_timed(prompts, new: int) -> float:
                ids = torch.tensor(prompts, device=device)
                sync()
                start = time.perf_counter()
                model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                               do_sample=False, eos_token_id=None, pad_token_id=0)
                sync()
                return time.perf_counter() - start

            with torch.inference_mode():
                for batch in batches:
                    prompts = [r.prompt for r in workload2(batch, args.prompt_len, n_new, max_token_id=tok_max)]
                    hf_timed(prompts, 4)
                    t1 = statistics.median(hf_timed(prompts, 1) for _ in range(args.repeats))
                    tn = statistics.median(hf_timed(prompts, n_new) for _ in range(args.repeats))
                    tpot = (tn - t1) / (n_new - 1)
                    floor = statistics.fmean(
                        decode_step_floor_s(shape, [args.prompt_len + t] * batch, ceil["copy_bytes_per_s"],
                                            ceil["matmul_flop_per_s"]) for t in range(1, n_new))
                    row = {"system": f"hf-generate ({n_new} new tokens)", "batch": batch, "t_first_s": t1,
                           "t_total_s": tn, "tpot_ms": tpot * 1e3, "floor_ms": floor * 1e3,
                           "over_floor": tpot / floor, "tok_per_s": batch / tpot}
                    results.append(row)
                    print(row, flush=True)

    dump(args.out, {"benchmark": "decode_latency (workload 2)", "model": args.model, "environment": env,
                    "ceilings": ceil, "init_s": init_s, "dropped_options": dropped, "results": results,
                    "argv": vars(args)})
    print()
    print(f"workload 2, {args.model} (dummy bf16 weights), {env.get('device')}, {env['date']}: prompt "
          f"{args.prompt_len}, {args.new_tokens} new tokens; TPOT = (T(all) - T(first)) / {args.new_tokens - 1}")
    print(format_table(["system", "batch", "TPOT ms", "floor ms", "TPOT / floor", "tok/s", "T(first) ms",
                        "aioinfer / vLLM TPOT"],
                       [[r["system"], r["batch"], r["tpot_ms"], r["floor_ms"], r["over_floor"], r["tok_per_s"],
                         r["t_first_s"] * 1e3, r.get("aioinfer_over_vllm_tpot")] for r in results]))


if __name__ == "__main__":
    main()
