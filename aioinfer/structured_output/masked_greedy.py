"""Greedy sampling under grammar masks in one launch: each row's argmax over the tokens its mask allows.

A constrained greedy step otherwise takes three launches after its masks are on the device: the
apply (disallowed logits to -inf, bitmask_apply.py), the sampler's float copy of the logits and
its argmax. Each costs the engine thread a launch in the step (0.07-0.11 ms of it for the apply
alone on a slow H200 host, 2026-12-04), and there the engine thread's
Python bounds a 0.5b step. When every sampled row has a mask and sampling is the plain argmax of
the raw logits (all greedy; no logit_bias, min_tokens, penalties or logprobs), this kernel does
all three in one: it reads each logits row in blocks, takes the float value of the allowed tokens
(-inf for the others) and keeps the first maximum, which is exactly what apply + ``float()`` +
``argmax`` give (a bf16 value is exact in float32; ties go to the lowest token, as torch's).
The logits are not modified.

``MaskedGreedy.enabled`` says whether the model runner takes this path (on: at 256 x 151,936 on the
H200 it takes 0.065 ms of device time and 27 µs of the engine thread's CPU against the three
launches' 0.31 ms and 73 µs; 2026-12-05). Class-wide, so that
tests and benchmarks can compare it with the three.
"""

from __future__ import annotations

import torch

from aioinfer.utils.triton_launch import CompiledLaunch, triton_available
from aioinfer.structured_output.bitmask_apply import apply_bitmask_reference
from aioinfer.sample.sampler import plain_greedy
from aioinfer.sample.sampling_metadata import SamplingMetadata

BLOCK = 4096  # tokens a program reads at a time (Qwen2.5's 151,936: 38 blocks a row)


class MaskedGreedy:
    enabled = True  # class-wide: benchmarks and tests switch it

    @classmethod
    def applies(cls, logits: torch.Tensor, metadata: SamplingMetadata) -> bool:
        """Whether a step whose every sampled row has a mask may be sampled by ``masked_greedy``."""
        return cls.enabled and logits.device.type == "cuda" and triton_available() and plain_greedy(metadata)


def masked_greedy_reference(logits: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    """The three steps it replaces, on a copy: [N] int64."""
    return apply_bitmask_reference(logits.clone(), bits, None).float().argmax(dim=-1)


_kernel = None


def _get_kernel() -> CompiledLaunch:
    global _kernel
    if _kernel is None:
        import triton
        import triton.language as tl

        @triton.jit
        def masked_argmax_kernel(logits_ptr, bits_ptr, out_ptr, logits_row_stride, num_words,
                                 VOCAB: tl.constexpr, BLOCK: tl.constexpr):
            row = tl.program_id(0).to(tl.int64)
            best = tl.full([], float("-inf"), tl.float32)
            best_token = tl.zeros([], tl.int32)
            for start in range(0, VOCAB, BLOCK):  # the vocabulary a constexpr: one model, one kernel
                tokens = start + tl.arange(0, BLOCK)
                in_vocab = tokens < VOCAB
                logit = tl.load(logits_ptr + row * logits_row_stride + tokens, mask=in_vocab, other=0.0)
                words = tl.load(bits_ptr + row * num_words + (tokens >> 5), mask=in_vocab, other=0)
                allowed = in_vocab & (((words >> (tokens & 31)) & 1) != 0)
                value = tl.where(allowed, logit.to(tl.float32), float("-inf"))
                block_best, block_token = tl.max(value, axis=0, return_indices=True,
                                                 return_indices_tie_break_left=True)
                # Strictly greater: an equal maximum in a later block is a higher token, which loses.
                better = block_best > best
                best = tl.where(better, block_best, best)
                best_token = tl.where(better, start + block_token, best_token)
            tl.store(out_ptr + row, best_token.to(tl.int64))

        _kernel = CompiledLaunch(masked_argmax_kernel)
    return _kernel


def masked_greedy(logits: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    """[N] int64: row ``i``'s first maximal logit among the tokens ``bits[i]`` allows (``logits``
    [N, V], rows contiguous; ``bits`` [N, W] int32, llguidance's layout). One launch, no host sync."""
    if logits.stride(1) != 1:
        raise ValueError("the logits' rows must be contiguous")
    bits = bits.contiguous()
    out = torch.empty(logits.shape[0], dtype=torch.int64, device=logits.device)
    if logits.shape[0]:
        _get_kernel()((logits.shape[0],), logits, bits, out, logits.stride(0), bits.shape[1], logits.shape[1], BLOCK)
    return out
