"""Paged decode attention (one query token per sequence), GQA-packed, split over the context.

One program handles (sequence, kv head, split): the G query heads that share the kv head are the
rows of one small matrix, so each K/V byte is read once per step. With ``num_splits > 1`` every split
writes an unnormalised partial result plus its running max and sum ("flash-decoding"), and a second
small kernel merges them.

CUDA graphs: the grid is (num_seqs, num_kv_heads, num_splits), all Python ints; each program reads
its sequence length in-kernel and takes its own share of the context (the context is cut into
``num_splits`` near-equal runs of TILE_N-token tiles), so one captured launch is valid for any
context lengths. Nothing here syncs with the host.

fp8 KV cache (float8_e4m3fn, attention/fp8_kv.py): each K and V tile is converted to the query dtype
as it is loaded, and the math is then the one above. The scales are applied outside the tiles: the
K scale is folded into the softmax scale (``q . (k_fp8 * k_scale) = (q . k_fp8) * k_scale``), and the
V scale multiplies the accumulated output once (``sum p (v_fp8 * v_scale) = v_scale * sum p v_fp8``),
before the division by the softmax sum (or before a split's partial is stored: the merge is linear
in it). Nothing per element is added to the inner loop beyond the conversion.
"""

from __future__ import annotations

import functools
from typing import Optional

import torch
import triton
import triton.language as tl

from aioinfer.attention.triton_ops._checks import (
    FP8_DTYPE, check_kv_scales, check_paged_query, interpreting, next_pow2,
)

LOG2E = 1.4426950408889634
_INTERPRET = interpreting()  # fixed when the kernels below are decorated, as triton decides it
MAX_SPLITS = 64
MIN_TOKENS_PER_SPLIT = 256  # below this a split's fixed cost (q load, merge) outweighs its share
PROGRAMS_PER_SM = 4  # grid target of the split heuristic


# num_splits and the block-table width change between eager steps: not specialised, so that no step
# triggers a compile (Triton makes a variant per value class: 1, multiple of 16, other).
@triton.jit(do_not_specialize=["num_splits", "stride_bt"])
def _decode_kernel(
    q_ptr,  # [S, Hq, D]
    k_cache_ptr, v_cache_ptr,  # [num_blocks, block_size, Hkv, D]
    out_ptr,  # [S, Hq, D] (used when not SPLIT)
    part_acc_ptr,  # [S, Hq, num_splits, D] fp32 (used when SPLIT)
    part_ml_ptr,  # [S, Hq, num_splits, 2] fp32: running max (log2 domain) and sum
    block_tables_ptr,  # [S, max_blocks] int32
    seq_lens_ptr,  # [S] int32
    scale_log2,  # softmax scale * log2(e) (* k_scale for an fp8 cache)
    v_scale,  # fp8 cache: the V scale, applied to the accumulated output (used when KV_FP8)
    num_splits,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_cb, stride_cs, stride_ch,
    stride_bt,
    G: tl.constexpr, G_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    TILE_N: tl.constexpr, SPLIT: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    KV_FP8: tl.constexpr,  # the cache holds fp8: tiles are converted to the query dtype on load
):
    seq = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    num_tiles = tl.cdiv(seq_len, TILE_N)
    tiles_per_split = tl.cdiv(num_tiles, num_splits)
    tile_lo = split * tiles_per_split
    tile_hi = tl.minimum(tile_lo + tiles_per_split, num_tiles)

    g = tl.arange(0, G_PAD)
    d = tl.arange(0, HEAD_DIM)
    head = kvh * G + g
    gmask = g < G
    seq64 = seq.to(tl.int64)
    q = tl.load(q_ptr + seq64 * stride_qt + head[:, None] * stride_qh + d[None, :], mask=gmask[:, None], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)

    m = tl.full([G_PAD], float("-inf"), tl.float32)
    l = tl.zeros([G_PAD], tl.float32)
    acc = tl.zeros([G_PAD, HEAD_DIM], tl.float32)
    bt_row = block_tables_ptr + seq64 * stride_bt
    for t in range(tile_lo, tile_hi):
        tok = t * TILE_N + tl.arange(0, TILE_N)
        tmask = tok < seq_len
        blk = tl.load(bt_row + tok // BLOCK_SIZE, mask=tmask, other=0).to(tl.int64)
        kv_off = blk * stride_cb + (tok % BLOCK_SIZE) * stride_cs + kvh * stride_ch  # [TILE_N]
        k = tl.load(k_cache_ptr + kv_off[:, None] + d[None, :], mask=tmask[:, None], other=0.0)  # [N, D]
        if KV_FP8:
            k = k.to(q_ptr.dtype.element_ty)
        if UPCAST:
            k = k.to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2  # [G_PAD, N]
        s = tl.where(tmask[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m - m_new)
        l = l * alpha + tl.sum(p, 1)
        v = tl.load(v_cache_ptr + kv_off[:, None] + d[None, :], mask=tmask[:, None], other=0.0)
        if KV_FP8:
            v = v.to(q_ptr.dtype.element_ty)
        p = p.to(v.dtype)  # probabilities rounded to the KV dtype, as the tensor cores take them
        if UPCAST:
            v = v.to(tl.float32)
            p = p.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=PRECISION)
        m = m_new

    if KV_FP8:
        acc = acc * v_scale
    if SPLIT:
        # Partial rows are [S, Hq, num_splits, D]; head-major so the merge reads one contiguous run.
        row = (seq64 * (G * tl.num_programs(1)) + head) * num_splits + split  # [G_PAD]
        tl.store(part_acc_ptr + row[:, None] * HEAD_DIM + d[None, :], acc, mask=gmask[:, None])
        tl.store(part_ml_ptr + row * 2, m, mask=gmask)
        tl.store(part_ml_ptr + row * 2 + 1, l, mask=gmask)
    else:
        l = tl.where(l > 0.0, l, 1.0)  # an empty context (padded graph row) gives 0, not NaN
        o = acc / l[:, None]
        tl.store(out_ptr + seq64 * stride_ot + head[:, None] * stride_oh + d[None, :],
                 o.to(out_ptr.dtype.element_ty), mask=gmask[:, None])


@triton.jit(do_not_specialize=["num_splits"])
def _merge_kernel(
    out_ptr,  # [S, Hq, D]
    part_acc_ptr,  # [S, Hq, num_splits, D] fp32
    part_ml_ptr,  # [S, Hq, num_splits, 2] fp32
    num_splits,
    stride_ot, stride_oh,
    HEAD_DIM: tl.constexpr, SPLITS_PAD: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    k = tl.arange(0, SPLITS_PAD)
    d = tl.arange(0, HEAD_DIM)
    kmask = k < num_splits
    row = (seq.to(tl.int64) * tl.num_programs(1) + head) * num_splits + k
    m = tl.load(part_ml_ptr + row * 2, mask=kmask, other=float("-inf"))
    l = tl.load(part_ml_ptr + row * 2 + 1, mask=kmask, other=0.0)
    m_max = tl.max(m, 0)
    m_max = tl.where(m_max > float("-inf"), m_max, 0.0)  # all splits empty: weights 0, no NaN
    w = tl.where(m > float("-inf"), tl.math.exp2(m - m_max), 0.0)  # empty splits weigh nothing
    acc = tl.load(part_acc_ptr + row[:, None] * HEAD_DIM + d[None, :], mask=kmask[:, None], other=0.0)
    total = tl.sum(w * l, 0)
    total = tl.where(total > 0.0, total, 1.0)
    o = tl.sum(acc * w[:, None], 0) / total
    tl.store(out_ptr + seq.to(tl.int64) * stride_ot + head * stride_oh + d, o.to(out_ptr.dtype.element_ty))


@functools.lru_cache(maxsize=8)
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def decode_config(head_dim: int, dtype: torch.dtype) -> dict:
    """Tile size (tokens per inner step), warps and pipeline depth for the decode kernel.

    H200, 7b heads, batch 64 x 4096 (benchmarks/paged_attention.py --tune): 128-token tiles, 4 warps,
    2 stages beat 64-token tiles by ~8% (134 vs 145 us at 3 splits)."""
    if dtype == torch.float32:  # correctness-only path: keep shared memory small
        return dict(TILE_N=32, num_warps=4, num_stages=1)
    if head_dim <= 128:
        return dict(TILE_N=128, num_warps=4, num_stages=2)
    return dict(TILE_N=32, num_warps=4, num_stages=2)


def choose_num_splits(
    num_seqs: int, num_kv_heads: int, max_seq_len: int, device: torch.device, max_splits: int = MAX_SPLITS
) -> int:
    """Splits per (sequence, kv head) so that the grid fills the GPU PROGRAMS_PER_SM times over, but never so many
    that a split covers fewer than MIN_TOKENS_PER_SPLIT tokens of the longest context.

    For CUDA graphs call this once per batch-size bucket with the maximum context the engine allows
    (``max_model_len``) and pass the result as ``num_splits``: the launch is then the same each step.
    """
    if device.type != "cuda":
        return min(4, max(1, max_seq_len // MIN_TOKENS_PER_SPLIT))  # interpreter: exercise the merge
    programs = max(1, num_seqs * num_kv_heads)
    want = -(-PROGRAMS_PER_SM * _num_sms(device.index if device.index is not None else torch.cuda.current_device()) // programs)
    by_len = max(1, -(-max_seq_len // MIN_TOKENS_PER_SPLIT))
    return max(1, min(want, by_len, max_splits))


def paged_decode(
    query: torch.Tensor,  # [S, Hq, D]: one token per sequence
    key_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [>= S, max_blocks] int32
    seq_lens: torch.Tensor,  # [>= S] int32, context length including the new token
    scale: float,
    max_seq_len: int,  # host bound on seq_lens (only used to choose num_splits)
    num_splits: Optional[int] = None,  # fix it (e.g. per CUDA-graph bucket); None = heuristic
    out: Optional[torch.Tensor] = None,  # [S, Hq, D], query dtype
    config: Optional[dict] = None,  # TILE_N / num_warps / num_stages override (benchmarks)
    k_scale: float = 1.0,  # fp8 cache: key = stored * k_scale (ignored for another cache dtype)
    v_scale: float = 1.0,
) -> torch.Tensor:
    """Attention of each sequence's single query over its paged context. Returns [S, Hq, D]."""
    block_size, num_kv_heads, head_dim = check_paged_query(query, key_cache, value_cache, block_tables, seq_lens, "S")
    kv_fp8 = key_cache.dtype == FP8_DTYPE
    if kv_fp8:
        check_kv_scales(k_scale, v_scale)
    num_seqs, num_heads, _ = query.shape
    if not (block_tables.shape[0] >= num_seqs and seq_lens.shape[0] >= num_seqs):
        raise ValueError("block_tables/seq_lens have fewer rows than query")
    if out is None:
        out = torch.empty_like(query)
    if not (out.shape == query.shape and out.dtype == query.dtype and out.stride(-1) == 1):
        raise ValueError("bad out tensor")
    if num_seqs == 0:
        return out
    if num_splits is None:
        num_splits = choose_num_splits(num_seqs, num_kv_heads, max_seq_len, query.device)
    group = num_heads // num_kv_heads
    cfg = config or decode_config(head_dim, query.dtype)
    part_acc, part_ml = split_partials(out, num_splits)  # checks num_splits
    split = num_splits > 1
    _decode_kernel[(num_seqs, num_kv_heads, num_splits)](
        query, key_cache, value_cache, out, part_acc, part_ml, block_tables, seq_lens,
        scale * (k_scale if kv_fp8 else 1.0) * LOG2E, float(v_scale) if kv_fp8 else 1.0, num_splits,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        block_tables.stride(0),
        G=group, G_PAD=max(16, next_pow2(group)), HEAD_DIM=head_dim, BLOCK_SIZE=block_size,
        TILE_N=cfg["TILE_N"], SPLIT=split, PRECISION="ieee" if query.dtype == torch.float32 else "tf32",
        UPCAST=query.dtype == torch.bfloat16 and _INTERPRET, KV_FP8=kv_fp8,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    if split:
        merge_splits(out, part_acc, part_ml, num_splits)
    return out


def split_partials(out: torch.Tensor, num_splits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The fp32 partial results of a split run for ``out`` [rows, Hq, D]: (acc [rows, Hq, splits, D],
    (max, sum) [rows, Hq, splits, 2]); ``out`` itself as an unused placeholder when not split."""
    if not (isinstance(num_splits, int) and 1 <= num_splits <= 256):
        raise ValueError(f"num_splits must be an int in 1..256, got {num_splits}")
    if num_splits == 1:
        return out, out
    rows, num_heads, head_dim = out.shape
    return (torch.empty(rows, num_heads, num_splits, head_dim, dtype=torch.float32, device=out.device),
            torch.empty(rows, num_heads, num_splits, 2, dtype=torch.float32, device=out.device))


def merge_splits(out: torch.Tensor, part_acc: torch.Tensor, part_ml: torch.Tensor, num_splits: int) -> None:
    """out[r, h] = the softmax-weighted combination of the ``num_splits`` partials of row r, head h
    (rows are sequences for decode, query tokens for a split prefill)."""
    rows, num_heads, head_dim = out.shape
    _merge_kernel[(rows, num_heads)](
        out, part_acc, part_ml, num_splits, out.stride(0), out.stride(1),
        HEAD_DIM=head_dim, SPLITS_PAD=next_pow2(num_splits), num_warps=4 if head_dim >= 128 else 2,
    )


def paged_decode_reference(query, key_cache, value_cache, block_tables, seq_lens, scale, k_scale: float = 1.0,
                           v_scale: float = 1.0) -> torch.Tensor:
    """Pure-torch reference of :func:`paged_decode` (gathers per sequence; syncs; tests only); an fp8
    cache is dequantized to float32 first."""
    from aioinfer.attention.dense import dense_causal_attention
    from aioinfer.attention.fp8_kv import dequantize, raw_bytes

    block_size, num_kv_heads, head_dim = key_cache.shape[1:]
    out = torch.empty_like(query)
    for i, n in enumerate(seq_lens[: query.shape[0]].tolist()):
        if n == 0:
            out[i] = 0
            continue
        blocks = block_tables[i, : -(-n // block_size)].long()
        k = raw_bytes(key_cache)[blocks].view(key_cache.dtype).reshape(-1, num_kv_heads, head_dim)[:n]
        v = raw_bytes(value_cache)[blocks].view(value_cache.dtype).reshape(-1, num_kv_heads, head_dim)[:n]
        k, v = dequantize(k, k_scale), dequantize(v, v_scale)  # float32 (fp8: times the scale)
        out[i : i + 1] = dense_causal_attention(query[i : i + 1], k, v, scale)
    return out
