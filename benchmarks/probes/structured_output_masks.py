"""Probe: host µs a step of filling llguidance token bitmasks for B rows of one JSON schema, and applying them.

Host cost of structured outputs per step: filling the token bitmasks (llguidance) of B requests
that share a JSON schema, on this machine's CPU, and applying them to [B, V] logits on the device.

    python -m benchmarks.probes.structured_output_masks [--model GGUF] [--batch 1 16 64 256] [--steps 64]

Each request walks its own matcher through one valid JSON document (the same one, token by token), so
every step fills B masks at B different points of a realistic output; the first steps of a new grammar
(lazy lexer) is reported apart. Prints µs per step and per row for fill (wall and CPU), and apply.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from aioinfer.fetch import fetch_default_model
from aioinfer.sampling_params import SamplingParams
from aioinfer.structured_output import StructuredOutputsParams
from aioinfer.structured_output.compiler import GrammarCompiler
from aioinfer.structured_output.grammar_mask import GrammarMasks
from aioinfer.sample.sampling_metadata import SamplingRow

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "age", "tags", "address"],
          "properties": {"name": {"type": "string", "maxLength": 40},
                         "age": {"type": "integer", "minimum": 0, "maximum": 150},
                         "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 4},
                         "address": {"type": "object", "required": ["city", "zip"], "additionalProperties": False,
                                     "properties": {"city": {"type": "string", "maxLength": 30},
                                                    "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}}}}
DOCUMENT = {"name": "Alice Smith the Third of Paris", "age": 34, "tags": ["red", "blue"],
            "address": {"city": "Paris", "zip": "75001"}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default=None, help="a GGUF or model folder with a tokenizer (default SmolLM2)")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 16, 64, 256])
    parser.add_argument("--steps", type=int, default=48)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    path = args.model or str(fetch_default_model())
    tokenizer = (AutoTokenizer.from_pretrained(path.rsplit("/", 1)[0], gguf_file=path.rsplit("/", 1)[1])
                 if path.endswith(".gguf") else AutoTokenizer.from_pretrained(path))
    vocab = len(tokenizer)
    vocab = (vocab + 63) // 64 * 64
    compiler = GrammarCompiler(tokenizer, vocab, [tokenizer.eos_token_id])
    params = StructuredOutputsParams(json=SCHEMA)
    tokens = tokenizer.encode(json.dumps(DOCUMENT), add_special_tokens=False)
    device = torch.device(args.device)
    masks = GrammarMasks(vocab, device)
    results = []
    for batch in args.batch:
        rows = [SamplingRow(SamplingParams(), [1], [], 0, (tokenizer.eos_token_id,), grammar=compiler.compile(params))
                for _ in range(batch)]
        logits = torch.randn(batch, vocab, device=device)
        fill_wall = fill_cpu = apply_wall = first_fill = 0.0
        steps = min(args.steps, len(tokens))
        for step in range(steps):
            wall, cpu = time.perf_counter(), time.process_time()
            mask = masks.fill(rows, None)
            if step == 0:  # a new grammar's first mask (llguidance builds its lexer lazily)
                first_fill = time.perf_counter() - wall
            else:
                fill_wall += time.perf_counter() - wall
                fill_cpu += time.process_time() - cpu
            if device.type == "cuda":
                torch.cuda.synchronize()
            wall = time.perf_counter()
            masks.apply(logits, mask)
            if device.type == "cuda":
                torch.cuda.synchronize()
            apply_wall += time.perf_counter() - wall
            for i, row in enumerate(rows):  # row i is (i % 8) tokens behind, so the batch is at mixed points
                at = step - (i % 8)
                if 0 <= at < len(tokens):
                    assert row.grammar.consume_token(tokens[at])
        later = steps - 1
        results.append({"batch": batch, "vocab": vocab, "steps": steps, "first_fill_us": 1e6 * first_fill,
                        "fill_us_per_step": 1e6 * fill_wall / later, "fill_cpu_us_per_step": 1e6 * fill_cpu / later,
                        "fill_us_per_row": 1e6 * fill_wall / later / batch,
                        "apply_us_per_step": 1e6 * apply_wall / steps})
    print(f"{'batch':>6} {'first fill us':>14} {'fill us/step':>13} {'fill cpu us':>12} {'fill us/row':>12} {'apply us/step':>14}")
    for r in results:
        print(f"{r['batch']:>6} {r['first_fill_us']:>14.0f} {r['fill_us_per_step']:>13.0f} {r['fill_cpu_us_per_step']:>12.0f} "
              f"{r['fill_us_per_row']:>12.1f} {r['apply_us_per_step']:>14.0f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": path, "device": str(device), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
