"""vLLM as the peer of the offline workloads (1 and 2), run the way its users run it, in a child process.

Used by offline_throughput.py (``--vllm``) and decode_latency.py (``--vllm``); not run on its own.
The child's ``PYTHONPATH`` is vLLM's alone (``--vllm-pythonpath``, e.g. /tmp/vllm-site where the GPU
machine installs it), so that its packages never shadow aioinfer's and aioinfer's never shadow its
own; the repository root is the child's working directory, so ``benchmarks`` still imports.

vLLM gets the same dummy bf16 folder, the same token ids (``TokensPrompt``: the folder has no
tokenizer, hence ``skip_tokenizer_init``), the same greedy sampling with EOS ignored and the same
limits (``max_model_len``, ``max_num_seqs``, ``max_num_batched_tokens``, ``gpu_memory_utilization``) and
formats (``quantization``, ``kv_cache_dtype``) as aioinfer; its defaults otherwise (torch.compile, CUDA graphs, its attention backend, prefix caching,
which ``reset_prefix_cache`` empties before every timed run as a fresh salt does for aioinfer). The
first run after start is a warm-up, as for aioinfer.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any, Optional, Sequence

from benchmarks.common import run_child, workload1, workload2, write_child_result


def run(mode: str, folder: str, pythonpath: Optional[str], timeout_s: float, **options: Any) -> dict[str, Any]:
    """Run ``mode`` ("offline" or "decode") in a child process with vLLM's own PYTHONPATH."""
    argv = ["benchmarks.vllm_peer", mode, "--folder", str(folder), "--options", json.dumps(options)]
    env = dict(os.environ, VLLM_USE_FLASHINFER_SAMPLER="0")  # flashinfer is not installed beside it
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return run_child(argv, timeout_s, env=env)


def _make_llm(folder: str, max_model_len: int, max_num_seqs: int, max_num_batched_tokens: Optional[int],
              gpu_memory_utilization: float, llm_options: Optional[dict[str, Any]] = None):
    from vllm import LLM

    kwargs: dict[str, Any] = dict(model=folder, load_format="dummy", dtype="bfloat16", skip_tokenizer_init=True,
                                  max_model_len=max_model_len, max_num_seqs=max_num_seqs, seed=0,
                                  gpu_memory_utilization=gpu_memory_utilization)
    if max_num_batched_tokens:
        kwargs["max_num_batched_tokens"] = max_num_batched_tokens
    return LLM(**kwargs, **(llm_options or {}))


def _generate(llm, prompts: Sequence[Sequence[int]], max_tokens: Sequence[int]) -> tuple[int, float]:
    """(output tokens, seconds) of one greedy run, prefix cache emptied first."""
    import torch
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = [SamplingParams(max_tokens=n, ignore_eos=True, temperature=0.0, detokenize=False) for n in max_tokens]
    llm.reset_prefix_cache()
    torch.cuda.synchronize()
    start = time.perf_counter()
    outs = llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params, use_tqdm=False)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    got = sum(len(o.outputs[0].token_ids) for o in outs)
    assert got == sum(max_tokens), (got, sum(max_tokens))
    return got, seconds


def offline(folder: str, num_requests: int, max_token_id: int, repeats: int, max_num_seqs: int,
            max_num_batched_tokens: int, gpu_memory_utilization: float,
            llm_options: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """Workload 1: the median of ``repeats`` timed runs of its requests, after a warm-up."""
    import vllm

    t0 = time.perf_counter()
    llm = _make_llm(folder, 2048, max_num_seqs, max_num_batched_tokens, gpu_memory_utilization, llm_options)
    init_s = time.perf_counter() - t0
    warm = workload1(num_requests=4, seed=1, max_input_len=200, max_output_len=110, max_token_id=500)
    _generate(llm, [r.prompt for r in warm], [r.max_tokens for r in warm])
    requests = workload1(max_token_id=max_token_id)[:num_requests]
    runs = []
    for _ in range(max(1, repeats)):
        got, seconds = _generate(llm, [r.prompt for r in requests], [r.max_tokens for r in requests])
        runs.append({"output_tokens": got, "seconds": seconds, "tok_per_s": got / seconds})
    full = dict(sorted(runs, key=lambda r: r["tok_per_s"])[len(runs) // 2])
    full["runs_tok_per_s"] = [round(r["tok_per_s"]) for r in runs]
    return {"vllm": vllm.__version__, "init_s": init_s, "full": full}


def decode(folder: str, batches: Sequence[int], prompt_len: int, new_tokens: int, repeats: int, max_token_id: int,
           gpu_memory_utilization: float, llm_options: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """Workload 2 as decode_latency.py times aioinfer: TPOT = (T(new_tokens) - T(1)) / (new_tokens - 1)."""
    import vllm

    llm = _make_llm(folder, prompt_len + new_tokens + 16, max(batches), None, gpu_memory_utilization, llm_options)
    rows = []
    for batch in batches:
        prompts = [r.prompt for r in workload2(batch, prompt_len, new_tokens, max_token_id=max_token_id)]
        _generate(llm, prompts, [8] * batch)
        t1 = statistics.median(_generate(llm, prompts, [1] * batch)[1] for _ in range(repeats))
        tn = statistics.median(_generate(llm, prompts, [new_tokens] * batch)[1] for _ in range(repeats))
        tpot = (tn - t1) / (new_tokens - 1)
        rows.append({"system": f"vllm {vllm.__version__}", "batch": batch, "t_first_s": t1, "t_total_s": tn,
                     "tpot_ms": tpot * 1e3, "tok_per_s": batch / tpot})
    return {"vllm": vllm.__version__, "results": rows}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=("offline", "decode"))
    p.add_argument("--folder", required=True)
    p.add_argument("--options", required=True, help="JSON keyword arguments of the mode's function")
    p.add_argument("--child-out", default=None)
    args = p.parse_args()
    options = json.loads(args.options)
    try:
        result = (offline if args.mode == "offline" else decode)(args.folder, **options)
    except Exception as exc:  # the parent reports it beside aioinfer's numbers rather than losing both
        result = {"error": f"{type(exc).__name__}: {exc}"}
        print(result, flush=True)
    write_child_result(args.child_out, result)
    if not args.child_out:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
