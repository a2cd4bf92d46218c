"""Workload 1 (offline throughput) for aioinfer and, in the same run, transformers' peers.

    python -m benchmarks.offline_throughput --model qwen2.5-0.5b --peer-requests 32 --out results/w1.json

Each system runs in its own child process (own CUDA context; memory freed between systems):
- ``aioinfer``: ``LLM(model=folder, load_format="dummy", dtype="bfloat16")`` on the whole workload,
  then on the peers' subset (the first ``--peer-requests`` requests), so that the peer ratio
  compares like with like;
- ``hf-cb-graphs`` / ``hf-cb-eager``: transformers continuous batching (attn ``paged|sdpa``),
  CUDA graphs on / off;
- ``hf-generate``: plain ``generate`` on static batches (sdpa, left padding); a batch runs until its
  longest request is done, and only the requested tokens are counted;
- ``--vllm``: vLLM's offline ``LLM`` on the whole workload (vllm_peer.py), ``--repeats`` runs as aioinfer's.
The peers are slow (~4 minutes for the whole workload on 7b), hence the subset.
Reports output tok/s, the ratio to each peer (same subset) and the ratio to the physical floor.
"""

from __future__ import annotations

import argparse
import gc
import inspect
import os
import tempfile
import time
from typing import Any

from benchmarks.common import (default_device, SHAPES, add_engine_options, ceilings, dump, engine_options, environment,
                               format_argv, format_options, with_formats, format_table,
                               output_tokens, run_child, workload1, workload_floor, write_child_result,
                               write_dummy_model)

PEERS = ("hf-cb-graphs", "hf-cb-eager", "hf-generate")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=sorted(SHAPES), default="qwen2.5-0.5b")
    p.add_argument("--num-requests", type=int, default=256, help="aioinfer's run (the workload: 256)")
    p.add_argument("--peer-requests", type=int, default=32, help="peers run the first N requests (0: all)")
    p.add_argument("--peers", default=",".join(PEERS), help=f"comma list out of {PEERS}")
    p.add_argument("--skip-peers", action="store_true")
    p.add_argument("--vllm", action="store_true", help="also vLLM's offline LLM on the whole workload")
    p.add_argument("--vllm-pythonpath", default=os.environ.get("VLLM_PYTHONPATH"),
                   help="vLLM's child's PYTHONPATH alone (e.g. /tmp/vllm-site); default: $VLLM_PYTHONPATH")
    p.add_argument("--generate-batch-size", type=int, default=64, help="hf-generate's static batch")
    p.add_argument("--attention-backend", default=None)
    p.add_argument("--enforce-eager", choices=("true", "false"), default=None)
    p.add_argument("--async-scheduling", choices=("true", "false"), default=None)
    p.add_argument("--enable-prefix-caching", choices=("true", "false"), default=None,
                   help="aioinfer only (default: the engine's, on); workload 1 shares no prefixes")
    p.add_argument("--repeats", type=int, default=1,
                   help="timed runs of the workload in one engine (fresh cache salt each); the median is reported")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--tensor-parallel-size", type=int, default=1, help="aioinfer only: GPUs the model is split over")
    p.add_argument("--device", default=None, help="cuda (default when present) or cpu (smoke test)")
    p.add_argument("--timeout", type=float, default=900, help="seconds for aioinfer's child process")
    p.add_argument("--peer-timeout", type=float, default=900, help="seconds per peer's child process")
    p.add_argument("--structured-json", nargs="?", const="strings", choices=sorted(STRUCTURED_SCHEMAS),
                   help="every request constrained by a JSON schema (STRUCTURED_SCHEMAS: free strings by "
                        "default; needs a tokenizer: --engine-option tokenizer=PATH)")
    p.add_argument("--out", default=None, help="JSON results")
    add_engine_options(p)
    # Child-process mode (internal).
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--child-out", default=None, help=argparse.SUPPRESS)
    p.add_argument("--folder", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()

    import torch

    device = default_device(args.device)
    shape = with_formats(SHAPES[args.model], args)
    tok_max = min(10000, shape.vocab - 1)
    requests = workload1(max_token_id=tok_max)[: args.num_requests]
    n_peer = args.peer_requests or len(requests)
    subset = workload1(max_token_id=tok_max)[:n_peer]

    if args.child:
        result = run_system(args.child, args, device, requests, subset)
        write_child_result(args.child_out, result)
        return

    env = environment()
    ceil = ceilings(device == "cuda")
    floor_full = workload_floor(shape, requests, ceil["copy_bytes_per_s"], ceil["matmul_flop_per_s"])
    floor_subset = workload_floor(shape, subset, ceil["copy_bytes_per_s"], ceil["matmul_flop_per_s"])
    print(f"{env}\nceilings: copy {ceil['copy_bytes_per_s'] / 1e12:.2f} TB/s, "
          f"bf16 matmul {ceil['matmul_flop_per_s'] / 1e12:.0f} TFLOP/s ({ceil['ceilings_source']})", flush=True)

    peers = [] if args.skip_peers else [x for x in args.peers.split(",") if x]
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_dummy_model(shape, tmp)
        common = ["benchmarks.offline_throughput", "--model", args.model, "--folder", str(folder),
                  "--num-requests", str(args.num_requests), "--peer-requests", str(n_peer),
                  "--device", device, "--max-num-seqs", str(args.max_num_seqs),
                  "--max-num-batched-tokens", str(args.max_num_batched_tokens),
                  "--gpu-memory-utilization", str(args.gpu_memory_utilization),
                  "--tensor-parallel-size", str(args.tensor_parallel_size),
                  "--generate-batch-size", str(args.generate_batch_size), "--repeats", str(args.repeats)]
        if args.attention_backend:
            common += ["--attention-backend", args.attention_backend]
        if args.enforce_eager:
            common += ["--enforce-eager", args.enforce_eager]
        if args.async_scheduling:
            common += ["--async-scheduling", args.async_scheduling]
        if args.enable_prefix_caching:
            common += ["--enable-prefix-caching", args.enable_prefix_caching]
        for option in args.engine_option:
            common += ["--engine-option", option]
        common += format_argv(args)
        if args.structured_json:
            common += ["--structured-json", args.structured_json]
        common += ["--peers", ",".join(peers)] if peers else ["--skip-peers"]
        results: dict[str, Any] = {}
        for system in ["aioinfer", *peers]:
            results[system] = run_child(common + ["--child", system],
                                        args.timeout if system == "aioinfer" else args.peer_timeout)
            print(f"{system}: {results[system]}", flush=True)
        if args.vllm:
            from benchmarks import vllm_peer

            results["vllm"] = vllm_peer.run(
                "offline", str(folder), args.vllm_pythonpath, args.peer_timeout, num_requests=len(requests),
                max_token_id=tok_max, repeats=args.repeats, max_num_seqs=args.max_num_seqs,
                max_num_batched_tokens=args.max_num_batched_tokens,
                gpu_memory_utilization=args.gpu_memory_utilization, llm_options=format_options(args))
            print(f"vllm: {results['vllm']}", flush=True)

    ours = results["aioinfer"]
    rows = []
    full = ours.get("full")
    if full:
        rows.append(["aioinfer", len(requests), full["output_tokens"], full["seconds"], full["tok_per_s"],
                     None, full["tok_per_s"] / floor_full["floor_tok_per_s"]])
    else:
        rows.append(["aioinfer", len(requests), None, None, None, None, None, ours.get("error")])
    vllm_ratio = None
    theirs = results.get("vllm", {}).get("full")
    if args.vllm:
        if full and theirs:
            vllm_ratio = full["tok_per_s"] / theirs["tok_per_s"]
            rows.append([f"vllm {results['vllm'].get('vllm')}", len(requests), theirs["output_tokens"],
                         theirs["seconds"], theirs["tok_per_s"], f"aioinfer {vllm_ratio:.3f}x (all requests)",
                         theirs["tok_per_s"] / floor_full["floor_tok_per_s"]])
        else:
            rows.append(["vllm", len(requests), None, None, None, None, None, results["vllm"].get("error")])
    ours_subset = ours.get("subset")
    if peers and ours_subset:
        rows.append(["aioinfer (peer subset)", n_peer, ours_subset["output_tokens"], ours_subset["seconds"],
                     ours_subset["tok_per_s"], None, ours_subset["tok_per_s"] / floor_subset["floor_tok_per_s"]])
    ratios = {}
    for peer in peers:
        r = results[peer]
        if "tok_per_s" not in r:
            rows.append([peer, n_peer, None, None, None, None, None, r.get("error")])
            continue
        ratio = ours_subset["tok_per_s"] / r["tok_per_s"] if ours_subset else None
        ratios[peer] = ratio
        rows.append([peer, n_peer, r["output_tokens"], r["seconds"], r["tok_per_s"],
                     None if ratio is None else f"aioinfer {ratio:.1f}x",
                     r["tok_per_s"] / floor_subset["floor_tok_per_s"]])

    payload = {"benchmark": "offline_throughput (workload 1)", "model": args.model, "shape": shape.hf_config(),
               "environment": env, "ceilings": ceil, "floor_full": floor_full, "floor_subset": floor_subset,
               "num_requests": len(requests), "peer_requests": n_peer, "results": results,
               "aioinfer_over_peer_same_subset": ratios,
               "aioinfer_over_vllm": vllm_ratio, "argv": vars(args)}
    dump(args.out, payload)
    print()
    print(f"workload 1, {args.model} (dummy bf16 weights), {env.get('device')}, {env['date']}; floor for "
          f"{len(requests)} requests {floor_full['floor_s']:.2f} s = {floor_full['floor_tok_per_s']:,.0f} tok/s "
          f"(compute {floor_full['floor_compute_s']:.2f} s, memory {floor_full['floor_memory_s']:.2f} s); "
          f"peers on the first {n_peer} requests (floor {floor_subset['floor_tok_per_s']:,.0f} tok/s)")
    print(format_table(["system", "requests", "output tokens", "seconds", "tok/s", "vs peer (same subset)",
                        "of floor", "note"], [row + [None] * (8 - len(row)) for row in rows]))


# ----------------------------------------------------------------------------- children

def run_system(system: str, args, device: str, requests, subset) -> dict[str, Any]:
    if system == "aioinfer":
        return run_aioinfer(args, device, requests, subset)
    if system in ("hf-cb-graphs", "hf-cb-eager"):
        return run_hf_cb(args, device, subset, graphs=system == "hf-cb-graphs")
    if system == "hf-generate":
        return run_hf_generate(args, device, subset)
    raise SystemExit(f"unknown system {system}")


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


# --structured-json: dummy weights pick tokens at random, so the schema must not let the output end
# early (a closed document leaves only EOS, a mask that costs nothing): an array that needs more
# items than any request has tokens. "strings": free strings, the common heavy case (a mask inside one
# allows most of the vocabulary; llguidance's precomputed slices cover exactly that), and the masks
# between them. "long-strings": every string at least 5,000 characters long, which never ends; a
# length-bounded string defeats those slices (measured on one CPU core with Qwen2.5's 151k vocabulary:
# 210 us a mask inside it against 47-84 us inside a free string).
STRUCTURED_SCHEMAS = {
    "strings": {"type": "object", "required": ["notes"], "additionalProperties": False,
                "properties": {"notes": {"type": "array", "minItems": 1000, "items": {"type": "string"}}}},
    "long-strings": {"type": "object", "required": ["notes"], "additionalProperties": False,
                     "properties": {"notes": {"type": "array", "minItems": 1000,
                                              "items": {"type": "string", "minLength": 5000}}}},
}


def run_aioinfer(args, device: str, requests, subset) -> dict[str, Any]:
    from aioinfer import SamplingParams
    from aioinfer.structured_output import StructuredOutputsParams
    from benchmarks.common import fresh_cache_salt, make_llm
    from benchmarks.triton_compiles import TritonCompiles

    t0 = time.perf_counter()
    llm, dropped = make_llm(args.folder, device,
                            None if args.enforce_eager is None else args.enforce_eager == "true",
                            args.attention_backend, max_model_len=2048, max_num_seqs=args.max_num_seqs,
                            max_num_batched_tokens=args.max_num_batched_tokens,
                            gpu_memory_utilization=args.gpu_memory_utilization,
                            tensor_parallel_size=args.tensor_parallel_size, **engine_options(args),
                            **({} if args.enable_prefix_caching is None
                               else {"enable_prefix_caching": args.enable_prefix_caching == "true"}),
                            **({} if args.async_scheduling is None
                               else {"async_scheduling": args.async_scheduling == "true"}))
    init_s = time.perf_counter() - t0

    def generate(reqs) -> dict[str, Any]:
        constraint = (StructuredOutputsParams(json=STRUCTURED_SCHEMAS[args.structured_json])
                      if args.structured_json else None)
        params = [SamplingParams(max_tokens=r.max_tokens, ignore_eos=True, temperature=0.0,
                                 structured_outputs=constraint) for r in reqs]
        masks = getattr(llm.engine.executor.runner, "grammar_masks", None)
        fill_s, fills = (masks.fill_seconds, masks.num_fills) if masks is not None else (0.0, 0)
        drafts = getattr(getattr(llm.engine, "scheduler", None), "draft_policy", None)
        drafted = (drafts.num_draft_tokens, drafts.num_accepted_tokens) if drafts is not None else None
        _sync(device)
        with TritonCompiles() as compiles:
            start = time.perf_counter()
            outs = llm.generate([r.prompt for r in reqs], params, use_tqdm=False, cache_salt=fresh_cache_salt())
            _sync(device)
            seconds = time.perf_counter() - start
        got = sum(len(o.outputs[0].token_ids) for o in outs)
        assert got == output_tokens(reqs), (got, output_tokens(reqs))
        # Kernel variants first met inside the timed run: their compiles are in ``seconds``.
        out = {"output_tokens": got, "seconds": seconds, "tok_per_s": got / seconds, "triton_compiles": compiles.names}
        if drafted is not None:  # speculation: its draft and accepted tokens in this run
            out["draft_tokens"] = drafts.num_draft_tokens - drafted[0]
            out["accepted_tokens"] = drafts.num_accepted_tokens - drafted[1]
        if constraint is not None and masks is not None and masks.num_fills > fills:
            out["mask_fill_ms_per_step"] = 1e3 * (masks.fill_seconds - fill_s) / (masks.num_fills - fills)
        return out

    # Warm-up: first kernels, allocator, graph capture (when the engine has it).
    t0 = time.perf_counter()
    generate(workload1(num_requests=4, seed=1, max_input_len=200, max_output_len=110, max_token_id=500))
    warmup_s = time.perf_counter() - t0
    result: dict[str, Any] = {"init_s": init_s, "warmup_s": warmup_s, "dropped_options": dropped,
                              "attention_backend": getattr(llm.config, "attention_backend", None),
                              "enable_prefix_caching": llm.config.cache.enable_prefix_caching,
                              "engine_options": engine_options(args)}
    runs = [generate(requests) for _ in range(max(1, args.repeats))]
    # The median run by throughput (one short run on a shared machine is mostly noise).
    result["full"] = dict(sorted(runs, key=lambda run: run["tok_per_s"])[len(runs) // 2])
    if len(runs) > 1:
        result["full"]["runs_tok_per_s"] = [round(run["tok_per_s"]) for run in runs]
    print(f"aioinfer full: {result['full']}", flush=True)
    if args.peers and not args.skip_peers:
        result["subset"] = generate(subset)
    llm.shutdown()  # tensor parallel: stop the worker processes
    return result


def _load_hf(folder: str, device: str, attn: str):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(folder)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    with torch.device(device):  # random init straight on the GPU (CPU init of 7b takes minutes)
        try:
            model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation=attn)
        except TypeError:
            model = AutoModelForCausalLM.from_config(cfg, torch_dtype=dtype, attn_implementation=attn)
    model = model.to(device=device, dtype=dtype).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def _kwargs_for(fn, **kwargs) -> dict[str, Any]:
    names = inspect.signature(fn).parameters
    if any(p.kind == p.VAR_KEYWORD for p in names.values()):
        return kwargs
    return {k: v for k, v in kwargs.items() if k in names}


def run_hf_cb(args, device: str, subset, graphs: bool) -> dict[str, Any]:
    """transformers continuous batching, attn ``paged|sdpa``, CUDA graphs on or off."""
    import torch
    import transformers
    from transformers import GenerationConfig

    model = _load_hf(args.folder, device, "paged|sdpa")
    gen = GenerationConfig(max_new_tokens=max(r.max_tokens for r in subset), do_sample=False,
                           eos_token_id=None, pad_token_id=0)
    cb_config = None
    note = []
    cb_cls = getattr(transformers, "ContinuousBatchingConfig", None)
    if cb_cls is not None:
        fields = getattr(cb_cls, "__dataclass_fields__", {}) or inspect.signature(cb_cls).parameters
        cb_kwargs = {"use_cuda_graph": graphs}
        if "auto_switch_to_flash" in fields:
            cb_kwargs["auto_switch_to_flash"] = False  # keep paged|sdpa, the named peer
        cb_config = cb_cls(**{k: v for k, v in cb_kwargs.items() if k in fields})
        if "use_cuda_graph" not in fields:
            note.append("ContinuousBatchingConfig has no use_cuda_graph")
    else:
        gen.use_cuda_graph = graphs  # older transformers read it from the generation config
        note.append("use_cuda_graph set on GenerationConfig")

    hints = None
    try:
        from transformers.generation.continuous_batching.utils import WorkloadHints

        hints = WorkloadHints(max_prompt_length=max(len(r.prompt) for r in subset),
                              max_generated_length=max(r.max_tokens for r in subset), num_requests=len(subset))
    except (ImportError, TypeError):
        pass
    cm_kwargs = _kwargs_for(model.continuous_batching_context_manager, generation_config=gen,
                            continuous_batching_config=cb_config, workload_hints=hints, block=True, timeout=10)
    result: dict[str, Any] = {"transformers": transformers.__version__, "attn": "paged|sdpa", "cuda_graphs": graphs,
                              "notes": note, "context_manager_kwargs": sorted(k for k, v in cm_kwargs.items()
                                                                              if v is not None)}
    t0 = time.perf_counter()
    with model.continuous_batching_context_manager(**cm_kwargs) as manager:
        result["start_s"] = time.perf_counter() - t0

        def run(reqs, tag: str) -> tuple[int, float]:
            add_kwargs = _kwargs_for(manager.add_request, eos_token_id=-1)
            _sync(device)
            start = time.perf_counter()
            ids = {}
            for i, r in enumerate(reqs):
                rid = manager.add_request(input_ids=r.prompt, request_id=f"{tag}{i}", max_new_tokens=r.max_tokens,
                                          **add_kwargs)
                ids[rid] = r.max_tokens
            got = 0
            done = 0
            while done < len(reqs):
                out = manager.get_result(timeout=5)
                if out is None:
                    if hasattr(manager, "is_running") and not manager.is_running():
                        raise RuntimeError("transformers' generation thread stopped")
                    continue
                if hasattr(out, "is_finished") and not out.is_finished():
                    continue
                if getattr(out, "error", None):
                    raise RuntimeError(f"request {out.request_id}: {out.error}")
                got += len(out.generated_tokens)
                done += 1
            _sync(device)
            return got, time.perf_counter() - start

        run(workload1(num_requests=4, seed=1, max_input_len=200, max_output_len=110, max_token_id=500), "warm")
        got, seconds = run(subset, "r")
    expected = output_tokens(subset)
    result.update(output_tokens=expected, generated_tokens=got, seconds=seconds, tok_per_s=expected / seconds)
    if got != expected:
        result["notes"].append(f"generated {got} tokens, expected {expected}")
    del model
    gc.collect()
    torch.cuda.empty_cache() if device == "cuda" else None
    return result


def run_hf_generate(args, device: str, subset) -> dict[str, Any]:
    """Plain ``generate``: static batches in workload order, left padding, sdpa, greedy, EOS off."""
    import torch
    import transformers

    model = _load_hf(args.folder, device, "sdpa")

    def batch_generate(reqs) -> int:
        width = max(len(r.prompt) for r in reqs)
        ids = torch.zeros(len(reqs), width, dtype=torch.long)
        mask = torch.zeros(len(reqs), width, dtype=torch.long)
        for i, r in enumerate(reqs):
            ids[i, width - len(r.prompt):] = torch.tensor(r.prompt)
            mask[i, width - len(r.prompt):] = 1
        new = max(r.max_tokens for r in reqs)
        out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), max_new_tokens=new,
                             do_sample=False, eos_token_id=None, pad_token_id=0)
        return (out.shape[1] - width) * len(reqs)

    with torch.inference_mode():
        batch_generate(workload1(num_requests=2, seed=1, max_input_len=200, max_output_len=110, max_token_id=500))
        _sync(device)
        start = time.perf_counter()
        generated = 0
        bs = args.generate_batch_size
        for i in range(0, len(subset), bs):
            generated += batch_generate(subset[i:i + bs])
        _sync(device)
        seconds = time.perf_counter() - start
    expected = output_tokens(subset)
    return {"transformers": transformers.__version__, "attn": "sdpa", "batch_size": bs, "output_tokens": expected,
            "generated_tokens_incl_padding": generated, "seconds": seconds, "tok_per_s": expected / seconds}


if __name__ == "__main__":
    main()
