"""Speculative decoding (n-gram drafts) against none, on input-grounded prompts: TPOT and acceptance.

    python -m benchmarks.spec_decode --model PATH.gguf --batches 1,64 --out spec.json
    python -m benchmarks.spec_decode --model PATH.gguf --device cpu --batches 1 --num-prompts 2 --max-tokens 48

Real text, greedy: each prompt asks the model to repeat, correct, edit or summarise a text or a
piece of code given in the prompt (paragraphs of this repository's docs and functions of its own
source, so nothing has to be downloaded), through the model's chat template. The engine runs the
same prompts twice, without and with ``--speculative-config`` (vLLM's JSON), in one process, one
engine at a time; greedy outputs are identical by construction (and checked), so both runs produce
the same tokens and the ratio of their times is the speed-up.

Batch 1: each prompt alone; TPOT = (T(max_tokens) - T(1)) / (tokens - 1) per prompt (decode_latency's
method), median over the prompts. Batch B > 1: the first B prompts (cycled) at once, after an
untimed run of the same batch with 32 tokens; output tok/s over the whole run, the median of
``--repeats`` runs (a run of 64 prompts lasts under half a second on the H200). Every timed run has
a fresh prefix-cache salt. Acceptance: accepted / draft tokens; mean accepted length: tokens per
verification round (1 + accepted / rounds), vLLM's "mean acceptance length".
"""

from __future__ import annotations

import argparse
import ast
import gc
import json
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks.common import default_device, dump, environment, format_table, fresh_cache_salt

TASKS = [
    ("Rewrite the following text exactly as it is, correcting only spelling mistakes. Reply with the text only."
     "\n\n{text}", "text"),
    ("Here is some Python code. Add a one-line comment above the first line, and otherwise repeat the code "
     "unchanged.\n\n{code}", "code"),
    ("Summarise the following text in three sentences, reusing its own words.\n\n{text}", "text"),
    ("Rename every variable called `request` to `req` in this code and reply with the whole code.\n\n{code}", "code"),
]
_ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="a model folder or .gguf file with a chat template (real weights)")
    p.add_argument("--batches", default="1,64")
    p.add_argument("--repeats", type=int, default=3, help="timed runs of each batch B > 1 (median reported)")
    p.add_argument("--num-prompts", type=int, default=8, help="prompts timed one by one at batch 1")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--alternate", type=int, default=1,
                   help="engines started off, on, off, on, ... this many pairs; speed-up: the median pair's")
    p.add_argument("--speculative-config", default='{"method": "ngram", "num_speculative_tokens": 8, '
                                                   '"prompt_lookup_max": 4, "prompt_lookup_min": 2}',
                   help="default: k = 8, the setting docs/spec_decode.md's figures are for")
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default=None, help="default: the engine's (bfloat16 on CUDA, float32 on CPU)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.4)
    p.add_argument("--out", default=None)
    args = p.parse_args()

    device = default_device(args.device)
    spec = json.loads(args.speculative_config)
    batches = [int(b) for b in args.batches.split(",")]
    env = environment()
    print(env, flush=True)
    pairs: list[dict[str, dict[str, Any]]] = []
    for _ in range(args.alternate):  # off, on, off, on, ...: a drift of the machine hits both alike
        runs: dict[str, dict[str, Any]] = {}
        for mode, extra in (("off", {}), ("on", {"speculative_config": spec})):
            runs[mode] = _run_mode(args, device, batches, extra)
            print(mode, json.dumps({k: v for k, v in runs[mode].items() if k != "outputs"}), flush=True)
        pairs.append(runs)
    identical = all(r["off"]["outputs"] == r["on"]["outputs"] for r in pairs)
    rows, results = [], []
    for batch in batches:
        key = str(batch)
        metric = "tpot_ms" if batch == 1 else "tok_per_s"
        ratios = [(r["off"][key][metric] / r["on"][key][metric]) if batch == 1
                  else (r["on"][key][metric] / r["off"][key][metric]) for r in pairs]
        speedup = statistics.median(ratios)
        off, on = pairs[-1]["off"][key], pairs[-1]["on"][key]
        results.append({"batch": batch, "off": off, "on": on, "speedup": speedup,
                        "pair_speedups": ratios})
        rows.append([batch, f"{off['tpot_ms']:.3f}" if batch == 1 else f"{off['tok_per_s']:,.0f}",
                     f"{on['tpot_ms']:.3f}" if batch == 1 else f"{on['tok_per_s']:,.0f}", f"{speedup:.2f}x",
                     " ".join(f"{r:.2f}" for r in ratios),
                     f"{on['acceptance']:.0%}", f"{on['mean_accepted_length']:.2f}", on["tokens"]])
    runs = pairs[-1]
    dump(args.out, {"benchmark": "spec_decode", "model": args.model, "environment": env, "argv": vars(args),
                    "speculative_config": spec, "identical_outputs": identical, "results": results,
                    "payoff_rates": runs["on"].get("payoff_rates")})
    print(format_table(["batch", "off (TPOT ms | tok/s)", "on", "speed-up", "pairs", "acceptance", "mean accepted length",
                        "tokens"], rows))
    print(f"identical outputs: {identical}")


def _run_mode(args, device: str, batches: list[int], extra: dict) -> dict[str, Any]:
    import torch

    from aioinfer import LLM, SamplingParams

    options = dict(device=device, max_model_len=4096, **extra)
    if device == "cuda":
        options["gpu_memory_utilization"] = args.gpu_memory_utilization
    if args.dtype or device != "cuda":
        options["dtype"] = args.dtype or "float32"
    llm = LLM(model=args.model, **options)
    prompts = _prompts(llm.get_tokenizer(), max(args.num_prompts, max(batches)))
    one = SamplingParams(temperature=0.0, max_tokens=1)
    full = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    llm.generate(prompts[:2], full, use_tqdm=False)  # warm-up: kernels, graphs, allocator
    policy = llm.engine.scheduler.draft_policy

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    def timed(batch_prompts, params):
        # A fresh prefix-cache salt per run: the T(max) run must not find the T(1) run's prompt cached.
        salt = fresh_cache_salt()
        sync()
        start = time.perf_counter()
        outs = llm.generate(batch_prompts, params, use_tqdm=False, cache_salt=salt)
        sync()
        return time.perf_counter() - start, [o.outputs[0].token_ids for o in outs]

    result: dict[str, Any] = {"outputs": {}}
    for batch in batches:
        before = _counts(policy)
        if batch == 1:
            tpots, tokens = [], 0
            for i, prompt in enumerate(prompts[:args.num_prompts]):
                t1, _ = timed([prompt], one)
                tn, (ids,) = timed([prompt], full)
                result["outputs"][f"1:{i}"] = ids
                tokens += len(ids)
                if len(ids) > 1:
                    tpots.append((tn - t1) / (len(ids) - 1))
            entry = {"tpot_ms": 1e3 * statistics.median(tpots), "tokens": tokens}
        else:
            chosen = [prompts[i % len(prompts)] for i in range(batch)]
            timed(chosen, SamplingParams(temperature=0.0, max_tokens=32))  # this batch's first kernels
            before = _counts(policy)
            runs = []
            for _ in range(args.repeats):
                seconds, outs = timed(chosen, full)
                runs.append((sum(map(len, outs)) / seconds, seconds))
            result["outputs"][str(batch)] = outs
            tokens = sum(map(len, outs))
            rate, seconds = sorted(runs)[len(runs) // 2]
            entry = {"tok_per_s": rate, "seconds": seconds, "tokens": tokens,
                     "runs_tok_per_s": [round(r) for r, _ in runs]}
        after = _counts(policy)
        drafts, draft_tokens, accepted = (a - b for a, b in zip(after, before))
        if batch > 1:  # per timed run
            drafts, draft_tokens, accepted = (x // args.repeats for x in (drafts, draft_tokens, accepted))
        entry.update(drafts=drafts, draft_tokens=draft_tokens, accepted_tokens=accepted,
                     acceptance=accepted / draft_tokens if draft_tokens else 0.0,
                     mean_accepted_length=1 + accepted / drafts if drafts else 1.0)
        result[str(batch)] = entry
    if policy is not None:  # measured tokens/s per batch-size bucket: (drafting, ahead)
        result["payoff_rates"] = {str(b): [round(d), round(a)] for b, (d, a) in policy.payoff.rates().items()}
    del llm
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return result


def _counts(policy) -> tuple[int, int, int]:
    if policy is None:
        return 0, 0, 0
    return policy.num_drafts, policy.num_draft_tokens, policy.num_accepted_tokens


def _prompts(tokenizer, count: int) -> list[list[int]]:
    """``count`` chat prompts (token ids): the tasks in turn, over the repository's paragraphs and functions."""
    texts, codes = _paragraphs(), _functions()
    prompts = []
    for i in range(count):
        template, kind = TASKS[i % len(TASKS)]
        source = texts if kind == "text" else codes
        content = template.format(**{kind: source[(i // len(TASKS)) % len(source)]})
        text = tokenizer.apply_chat_template([{"role": "user", "content": content}], tokenize=False,
                                             add_generation_prompt=True)
        prompts.append(tokenizer.encode(text, add_special_tokens=False))
    return prompts


def _paragraphs() -> list[str]:
    """Prose paragraphs of 300-900 characters from the repository's docs, in a fixed order."""
    out = []
    for path in sorted((_ROOT / "docs").glob("*.md")) + [_ROOT / "README.md"]:
        for block in path.read_text().split("\n\n"):
            block = block.strip()
            if 300 <= len(block) <= 900 and block[0].isalpha() and "|" not in block and "```" not in block:
                out.append(block)
    return out[:64]


def _functions() -> list[str]:
    """Functions of 300-1200 characters from aioinfer's own source, in a fixed order."""
    out = []
    for path in sorted((_ROOT / "aioinfer").rglob("*.py")):
        source = path.read_text()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                text = ast.get_source_segment(source, node) or ""
                if 300 <= len(text) <= 1200:
                    out.append(text)
    return out[:64]


if __name__ == "__main__":
    main()
