"""Fourteenth session: the host time of each engine-side piece of a constrained 0.5b step (256 rows,
Qwen2.5's vocabulary, the free-strings schema), median of many calls: what the deferred path adds
to the engine thread (call 4: 0.46 ms a step with no grammar work at all).

    python3 host_pieces.py TOKENIZER_DIR
"""
import statistics
import sys
import time

import torch
from transformers import AutoTokenizer

from aioinfer import SamplingParams
from aioinfer.structured_output import StructuredOutputsParams
from aioinfer.structured_output.compiler import GrammarCompiler
from aioinfer.worker import bitmask_apply
from aioinfer.worker.grammar_mask import GrammarMasks, live_tokens
from aioinfer.worker.sampling_metadata import SamplingMetadata, SamplingRow
from benchmarks.offline_throughput import STRUCTURED_SCHEMAS

N, VOCAB, ITERS = 256, 151936, 300
device = torch.device("cuda")
tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
compiler = GrammarCompiler(tokenizer, VOCAB, [tokenizer.eos_token_id])
constraint = StructuredOutputsParams(json=STRUCTURED_SCHEMAS["strings"])
states = [SamplingRow(SamplingParams(temperature=0.0), [1], [], 0, (tokenizer.eos_token_id,),
                      grammar=compiler.compile(constraint)) for _ in range(N)]
masks = GrammarMasks(VOCAB, device)
logits = torch.randn(N, VOCAB, device=device, dtype=torch.bfloat16)
results = {}


class _DoneJob:  # a worker's job already finished, as finish_fill finds one
    live, rejected, started, finished = (), None, 0.0, 0.0

    def is_done(self):
        return True

    def wait(self):
        pass


def timed(name, fn, sync=True):
    samples = []
    for _ in range(ITERS):
        if sync:
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    results[name] = 1e6 * statistics.median(samples)


with torch.inference_mode():
    pending = masks.plan(states, tokens_known=False)
    masks._compute(pending)
    timed("plan (incl. 4.9 MB pinned alloc)", lambda: masks.plan(states, tokens_known=False))
    timed("pinned alloc alone", lambda: torch.empty((N, masks.num_words), dtype=torch.int32, pin_memory=True))

    def copy():
        pending.copied = None
        masks._copy_to_device(pending)
    timed("_copy_to_device (stream ctx, .to, event)", copy)

    # (Call 5 ran this without a job on ``pending``: finish_fill then computed the masks itself,
    # and its 811 us were that computation, not the finish. Fixed after the call, not rerun.)
    pending.job = _DoneJob()

    def finish():
        masks.finish_fill(pending)
    timed("finish_fill after the copy", finish)
    bits = pending.bits
    torch.cuda.synchronize()
    timed("apply: Triton launch", lambda: bitmask_apply.apply_bitmask_triton(logits, bits, None))
    timed("apply: torch ops", lambda: bitmask_apply.apply_bitmask_torch(logits, bits, None))
    kernel = bitmask_apply._get_kernel()
    import triton
    grid = (N, triton.cdiv(VOCAB, 2048))
    compiled = kernel[grid](logits, bits, bits, VOCAB, logits.stride(0), bits.shape[1], HAS_ROWS=False, BLOCK=2048)
    try:
        runner = compiled[grid]
        timed("apply: compiled kernel direct", lambda: runner(logits, bits, bits, VOCAB, logits.stride(0),
                                                              bits.shape[1], False, 2048))
    except Exception as error:  # the CompiledKernel API differs between Triton versions
        results[f"apply: compiled kernel direct FAILED {type(error).__name__}: {error}"[:120]] = float("nan")
    tokens = [198] * N
    timed("live_tokens (256 is_stopped)", lambda: live_tokens(states, tokens, pending.grammar_states), sync=False)
    timed("SamplingMetadata.build (free too)", lambda: SamplingMetadata.build(states, VOCAB, device))
    timed("torch.cuda.Event() + record", lambda: torch.cuda.Event().record())
    stream = torch.cuda.Stream(device)

    def ctx():
        with torch.cuda.stream(stream):
            pass
    timed("torch.cuda.stream ctx enter/exit", ctx)
    timed("empty kernel launch (logits.zero_ on 1 elem)", lambda: logits[0, :1].zero_())
    print(f"triton {triton.__version__}, torch {torch.__version__}")
    for name, us in results.items():
        print(f"{us:9.1f} us  {name}")
masks.close()
