"""Probe: host µs of the n-gram proposer per draft attempt and per prompt token indexed (CPU).

Host cost of the n-gram proposer (spec_decode/ngram.py): µs per draft attempt, and per prompt token
for the index's first build. It runs on the engine thread under the interpreter lock, once per
drafting request per step, so its cost is paid in the step's host time.

    python -m benchmarks.probes.ngram_proposer_cost --out ngram.json

Sequences: this repository's own text and code as token ids of a real tokenizer (``--tokenizer``,
a folder or a .gguf; default: the SmolLM2 GGUF in the aioinfer cache if present), else random ids
over a small vocabulary (matches are then frequent). Per sequence: the prompt is the first
``--prompt-len`` tokens, then one attempt per generated token as the output grows by the
sequence's own next tokens (so the attempts see the matches a copying model would produce).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from pathlib import Path

from benchmarks.common import dump, environment, format_table


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokenizer", default=None)
    p.add_argument("--prompt-len", type=int, default=1024)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--lookup", default="2,4", help="prompt_lookup_min,prompt_lookup_max")
    p.add_argument("--sequences", type=int, default=8)
    p.add_argument("--out", default=None)
    args = p.parse_args()

    from aioinfer.spec_decode.ngram import NgramIndex

    lo, hi = (int(x) for x in args.lookup.split(","))
    sequences, source = _sequences(args)
    rows, results = [], []
    for name, seqs in sequences.items():
        build, attempt, hits = [], [], 0
        for seq in seqs:
            prompt, rest = seq[:args.prompt_len], seq[args.prompt_len:args.prompt_len + args.output_len]
            start = time.perf_counter()
            index = NgramIndex(prompt, lo, hi)
            index.propose([], args.k)  # the first call indexes the whole prompt
            build.append((time.perf_counter() - start) / len(prompt))
            output: list[int] = []  # grows one token at a time, as a request's output does
            for token in rest[:-1]:
                output.append(token)
                start = time.perf_counter()
                drafts = index.propose(output, args.k)
                attempt.append(time.perf_counter() - start)
                hits += bool(drafts)
        results.append({"sequences": name, "build_us_per_prompt_token": 1e6 * statistics.median(build),
                        "attempt_us_median": 1e6 * statistics.median(attempt),
                        "attempt_us_p99": 1e6 * sorted(attempt)[int(0.99 * len(attempt))],
                        "match_rate": hits / len(attempt)})
        r = results[-1]
        rows.append([name, f"{r['build_us_per_prompt_token']:.2f}", f"{r['attempt_us_median']:.2f}",
                     f"{r['attempt_us_p99']:.2f}", f"{r['match_rate']:.0%}"])
    dump(args.out, {"benchmark": "ngram_proposer_cost", "environment": environment(), "argv": vars(args),
                    "source": source, "results": results})
    print(format_table(["sequences", "build µs / prompt token", "attempt µs (median)", "attempt µs (p99)",
                        "attempts with a draft"], rows))


def _sequences(args) -> tuple[dict[str, list[list[int]]], str]:
    root = Path(__file__).resolve().parents[2]  # the repository
    texts = [p.read_text() for p in sorted((root / "docs").glob("*.md"))] + \
            [p.read_text() for p in sorted((root / "aioinfer").rglob("*.py"))]
    need = args.prompt_len + args.output_len
    out: dict[str, list[list[int]]] = {}
    tokenizer, source = _tokenizer(args.tokenizer)
    if tokenizer is not None:
        ids = [t for text in texts for t in tokenizer.encode(text, add_special_tokens=False)]
        step = max(1, (len(ids) - need) // args.sequences)
        out["repository text and code"] = [ids[i * step:i * step + need] for i in range(args.sequences)]
    rng = random.Random(0)
    out["random ids, vocabulary 50"] = [[rng.randrange(50) for _ in range(need)] for _ in range(args.sequences)]
    return out, source


def _tokenizer(path):
    from transformers import AutoTokenizer

    if path is None:
        from aioinfer.fetch import cache_root

        default = cache_root() / "smollm2-135m-instruct" / "SmolLM2-135M-Instruct.Q4_1.gguf"
        path = str(default) if default.is_file() else None
    if path is None:
        return None, "random ids only (no tokenizer)"
    if path.endswith(".gguf"):
        return AutoTokenizer.from_pretrained(str(Path(path).parent), gguf_file=Path(path).name), path
    return AutoTokenizer.from_pretrained(path), path


if __name__ == "__main__":
    main()
