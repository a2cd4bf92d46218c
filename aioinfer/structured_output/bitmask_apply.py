"""Structured outputs' last step before sampling: every logit a row's token bitmask disallows to -inf.

A mask row is ``W = ceil(V / 32)`` int32 words; bit ``j`` of word ``w`` allows token ``32 w + j``
(llguidance's layout). On CUDA one Triton launch does it for the whole batch, in place (the torch
form took six launches and two [G, V] boolean temporaries: about 0.16 ms of host time a step at 256
rows, on the path between the masks being ready and the step being sampled). On the CPU NumPy
unpacks the bits in C. Both give the same logits; tests compare them.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from aioinfer.utils.triton_launch import CompiledLaunch, triton_available


def apply_bitmask_reference(logits: torch.Tensor, bits: torch.Tensor, rows: Optional[torch.Tensor]) -> torch.Tensor:
    """The CPU (and reference) form: ``logits`` [N, V] in place; ``bits`` [G, W] int32; ``rows`` [G]
    int64 (the logits row of each mask), or None for every row in order."""
    vocab = logits.shape[1]
    bits = bits.cpu()
    # Little-endian words: byte order is bit order, so unpacking the bytes gives token order.
    unpacked = np.unpackbits(bits.numpy().view(np.uint8), axis=1, bitorder="little")[:, :vocab]
    disallowed = ~torch.from_numpy(unpacked).view(torch.bool).to(logits.device)  # [G, V]
    if rows is None:
        logits.masked_fill_(disallowed, float("-inf"))
    else:
        rows = rows.to(logits.device)
        logits[rows] = logits[rows].masked_fill(disallowed, float("-inf"))
    return logits


_kernel = None


def _get_kernel() -> CompiledLaunch:
    global _kernel
    if _kernel is None:
        import triton
        import triton.language as tl

        @triton.jit
        def apply_bitmask_kernel(logits_ptr, bits_ptr, rows_ptr, vocab_size, logits_row_stride, num_words,
                                 HAS_ROWS: tl.constexpr, BLOCK: tl.constexpr):
            g = tl.program_id(0)
            tokens = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
            in_vocab = tokens < vocab_size
            row = tl.load(rows_ptr + g) if HAS_ROWS else g
            words = tl.load(bits_ptr + g.to(tl.int64) * num_words + (tokens >> 5), mask=in_vocab, other=0)
            allowed = ((words >> (tokens & 31)) & 1) != 0
            out = logits_ptr + row.to(tl.int64) * logits_row_stride + tokens
            # Only disallowed entries are written: the allowed logits stay exactly as they were.
            tl.store(out, tl.full([BLOCK], float("-inf"), tl.float32).to(logits_ptr.dtype.element_ty),
                     mask=in_vocab & ~allowed)

        _kernel = CompiledLaunch(apply_bitmask_kernel)  # launched every constrained step: utils/triton_launch.py
    return _kernel


def apply_bitmask_triton(logits: torch.Tensor, bits: torch.Tensor, rows: Optional[torch.Tensor],
                         block: int = 2048) -> torch.Tensor:
    """``apply_bitmask_reference`` on CUDA tensors in one launch (no host sync)."""
    if logits.stride(1) != 1:
        raise ValueError("the logits' rows must be contiguous")
    bits = bits.contiguous()
    num_masks, vocab = bits.shape[0], logits.shape[1]
    if num_masks and vocab:
        import triton

        grid = (num_masks, triton.cdiv(vocab, block))
        _get_kernel()(grid, logits, bits, rows if rows is not None else bits, vocab, logits.stride(0), bits.shape[1],
                      rows is not None, block)
    return logits


_BIT_VALUES: dict = {}


def _bit_values(device: torch.device) -> torch.Tensor:
    """[32] int32: 1 << j, made once a device (a host-to-device copy each call cost more than the ops)."""
    values = _BIT_VALUES.get(device)
    if values is None:
        values = _BIT_VALUES[device] = torch.from_numpy(
            (np.uint32(1) << np.arange(32, dtype=np.uint32)).view(np.int32)).to(device)
    return values


def apply_bitmask_torch(logits: torch.Tensor, bits: torch.Tensor, rows: Optional[torch.Tensor]) -> torch.Tensor:
    """The same in torch ops on the logits' device (CUDA without Triton)."""
    bit_values = _bit_values(logits.device)
    disallowed = ((bits.unsqueeze(-1) & bit_values) == 0).view(bits.shape[0], -1)[:, :logits.shape[1]]  # [G, V]
    if rows is None:
        return logits.masked_fill_(disallowed, float("-inf"))
    logits[rows] = logits[rows].masked_fill(disallowed, float("-inf"))
    return logits


def apply_bitmask(logits: torch.Tensor, bits: torch.Tensor, rows: Optional[torch.Tensor]) -> torch.Tensor:
    """Disallowed logits to -inf, in place: Triton on CUDA, NumPy + torch on the CPU."""
    if logits.device.type == "cpu":
        return apply_bitmask_reference(logits, bits, rows)
    if logits.device.type == "cuda" and triton_available():
        return apply_bitmask_triton(logits, bits, rows)
    return apply_bitmask_torch(logits, bits, rows)
