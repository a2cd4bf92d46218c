"""Probe: llguidance mask/advance time of 256 matchers by executor thread count and matcher construction.

llguidance's executor on this host: masks and advances for 256 matchers of the free-strings schema
(random allowed tokens), by thread count and by how the matchers were made: K deep copies' templates
(``deep_copy`` of K independently built matchers; copies share their template's lexer state) or 0 =
each matcher built on its own (what the compiler does).

    python -m benchmarks.probes.structured_output_threads TOKENIZER_FOLDER [THREADS=1,4,8,12,15] [K=1,16,0]
"""

from __future__ import annotations

import sys
import time

import numpy as np
import torch


def main() -> None:
    import llguidance
    from transformers import AutoTokenizer

    from aioinfer.structured_output import StructuredOutputsParams
    from aioinfer.structured_output.compiler import GrammarCompiler
    from benchmarks.offline_throughput import STRUCTURED_SCHEMAS

    tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
    thread_counts = [int(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "1,4,8,12,15").split(",")]
    template_counts = [int(x) for x in (sys.argv[3] if len(sys.argv) > 3 else "1,16,0").split(",")]
    vocab, num_rows, steps = 151_936, 256, 40
    words = (vocab + 31) // 32
    compiler = GrammarCompiler(tokenizer, vocab, [tokenizer.eos_token_id])
    params = StructuredOutputsParams(json=STRUCTURED_SCHEMAS["strings"])
    for k in template_counts:
        templates = [compiler.compile(params) for _ in range(max(k, 1))]
        matchers = [compiler.compile(params) if k == 0 else templates[i % k].deep_copy() for i in range(num_rows)]
        for threads in thread_counts:
            rng = np.random.default_rng(0)
            for m in matchers:
                m.reset()
            executor = llguidance.LLExecutor(threads)
            host = torch.empty((num_rows, words), dtype=torch.int32, pin_memory=torch.cuda.is_available())
            mask_s = advance_s = 0.0
            for step in range(steps + 5):
                t0 = time.perf_counter()
                executor.unsafe_compute_mask_ptr([(m, i) for i, m in enumerate(matchers)], host.data_ptr(),
                                                 words * 4, num_rows)
                t1 = time.perf_counter()
                bits = np.unpackbits(host.numpy().view(np.uint8), axis=1, bitorder="little")[:, :vocab]
                pairs = [(m, int(rng.choice(np.flatnonzero(bits[i])))) for i, m in enumerate(matchers)]
                t2 = time.perf_counter()
                assert all(executor.consume_token_par(pairs))
                t3 = time.perf_counter()
                if step >= 5:  # the first steps build the lexers' states
                    mask_s += t1 - t0
                    advance_s += t3 - t2
            print(f"K={k:3d} threads {threads:2d}: masks {mask_s / steps * 1e3:.3f} ms a step, "
                  f"advance {advance_s / steps * 1e3:.3f} ms a step", flush=True)


if __name__ == "__main__":
    main()
