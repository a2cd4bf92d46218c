"""Paged prefill / chunked-prefill / mixed-batch attention over ragged query lengths.

Each sequence's queries are the last ``q_len`` positions of its context: they attend to the cached
prefix through the block table and causally within the chunk. Decode rows (q_len 1) may sit in the
same batch. A program handles BLOCK_Q query tokens x the G query heads of one kv head (rows packed
token-major, heads padded to a power of two), so K/V tiles are shared by the whole GQA group.

Programs are numbered over all sequences' query blocks without host help: sequence i owns program
ids ``qsl[i] // BLOCK_Q + i`` .. ``qsl[i+1] // BLOCK_Q + i`` (a binary search over query_start_loc
finds it), so the grid is ``num_tokens // BLOCK_Q + num_seqs`` programs per kv head; the few that
fall past a sequence's last query exit at once.

A short chunk over a long cached context (a prefix-cache hit: 32 new tokens after 4096 cached ones)
makes only a dozen programs, each walking the whole context alone, on a GPU of 132 SMs. Such steps
split the context as the decode kernel does ("flash-decoding"): a third grid axis of ``num_splits``
programs each take a near-equal run of key tiles and write unnormalised partials that the decode
kernel's merge combines. The split count is a Python int chosen from the step's host metadata.

fp8 KV cache (float8_e4m3fn): as in the decode kernel (decode.py says why it is exact), K and V
tiles are converted to the query dtype on load, the K scale is folded into the softmax scale and
the V scale multiplies each program's accumulated output once, before normalising or storing a
split's partial.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from aioinfer.attention.triton_ops._checks import (
    FP8_DTYPE, check_int_vector, check_kv_scales, check_paged_query, interpreting, next_pow2,
)
from aioinfer.attention.triton_ops.decode import choose_num_splits, merge_splits, split_partials

LOG2E = 1.4426950408889634
_INTERPRET = interpreting()  # fixed when the kernels below are decorated, as triton decides it


@triton.jit
def _find_seq(qsl_ptr, pid, num_seqs, BLOCK_Q: tl.constexpr):
    lo = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        start = tl.load(qsl_ptr + mid) // BLOCK_Q + mid
        if start <= pid:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _attend_tile(q, m, l, acc, q_pos, tok0, kv_end, bt_row, k_cache_ptr, v_cache_ptr, kvh, scale_log2,
                 stride_cb, stride_cs, stride_ch, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                 TILE_N: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr, MASKED: tl.constexpr,
                 KV_FP8: tl.constexpr):
    """One online-softmax step over keys tok0 .. tok0+TILE_N-1; MASKED applies causality and kv_end;
    KV_FP8 converts the fp8 tiles to q's dtype (their scales are applied by the caller)."""
    tok = tok0 + tl.arange(0, TILE_N)
    d = tl.arange(0, HEAD_DIM)
    if MASKED:
        tmask = tok < kv_end
        blk = tl.load(bt_row + tok // BLOCK_SIZE, mask=tmask, other=0).to(tl.int64)
    else:
        blk = tl.load(bt_row + tok // BLOCK_SIZE).to(tl.int64)
    kv_off = blk * stride_cb + (tok % BLOCK_SIZE) * stride_cs + kvh * stride_ch
    if MASKED:
        k = tl.load(k_cache_ptr + kv_off[:, None] + d[None, :], mask=tmask[:, None], other=0.0)
    else:
        k = tl.load(k_cache_ptr + kv_off[:, None] + d[None, :])
    if KV_FP8:
        k = k.to(q.dtype)
    if UPCAST:
        k = k.to(tl.float32)
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2  # [M, N]
    if MASKED:
        visible = (tok[None, :] <= q_pos[:, None]) & tmask[None, :]
        s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, 1))
    # Rows that see nothing yet keep m = -inf; shift by 0 there to avoid inf - inf.
    m_safe = tl.where(m_new > float("-inf"), m_new, 0.0)
    p = tl.math.exp2(s - m_safe[:, None])
    alpha = tl.math.exp2(m - m_safe)
    l = l * alpha + tl.sum(p, 1)
    if MASKED:
        v = tl.load(v_cache_ptr + kv_off[:, None] + d[None, :], mask=tmask[:, None], other=0.0)
    else:
        v = tl.load(v_cache_ptr + kv_off[:, None] + d[None, :])
    if KV_FP8:
        v = v.to(q.dtype)
    p = p.to(v.dtype)  # probabilities rounded to the KV dtype, as the tensor cores take them
    if UPCAST:
        v = v.to(tl.float32)
        p = p.to(tl.float32)
    acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=PRECISION)
    return m_new, l, acc


# Triton compiles a variant per value class (1, multiple of 16, other) of every int argument it
# specialises; these change from step to step, and a compile in the middle of serving costs ~0.5 s.
@triton.jit(do_not_specialize=["num_seqs", "num_splits", "stride_bt"])
def _prefill_kernel(
    q_ptr,  # [T, Hq, D]
    k_cache_ptr, v_cache_ptr,  # [num_blocks, block_size, Hkv, D]
    out_ptr,  # [T, Hq, D] (used when not SPLIT)
    part_acc_ptr,  # [T, Hq, num_splits, D] fp32 (used when SPLIT)
    part_ml_ptr,  # [T, Hq, num_splits, 2] fp32: running max (log2 domain) and sum
    block_tables_ptr,  # [S, max_blocks] int32
    seq_lens_ptr,  # [S] int32
    qsl_ptr,  # [S + 1] int32
    scale_log2,  # softmax scale * log2(e) (* k_scale for an fp8 cache)
    v_scale,  # fp8 cache: the V scale, applied to the accumulated output (used when KV_FP8)
    num_seqs,
    num_splits,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_cb, stride_cs, stride_ch,
    stride_bt,
    G: tl.constexpr, G_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr, TILE_N: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    SPLIT: tl.constexpr, KV_FP8: tl.constexpr,
):
    BLOCK_Q: tl.constexpr = BLOCK_M // G_PAD
    pid = tl.program_id(0)
    kvh = tl.program_id(1)
    seq = _find_seq(qsl_ptr, pid, num_seqs, BLOCK_Q)
    q_start = tl.load(qsl_ptr + seq)
    q_len = tl.load(qsl_ptr + seq + 1) - q_start
    qb = pid - (q_start // BLOCK_Q + seq)  # query block within the sequence
    if qb * BLOCK_Q >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    ctx_len = seq_len - q_len  # tokens cached before this chunk

    r = tl.arange(0, BLOCK_M)
    qi = qb * BLOCK_Q + r // G_PAD  # query index within the sequence's chunk
    gi = r % G_PAD
    head = kvh * G + gi
    row_mask = (qi < q_len) & (gi < G)
    q_tok = (q_start + qi).to(tl.int64)
    d = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + q_tok[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :],
                mask=row_mask[:, None], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    q_pos = ctx_len + qi  # absolute position; sees keys 0..q_pos

    # Keys past the block's last query position are never needed.
    kv_end = tl.minimum(seq_len, ctx_len + (qb + 1) * BLOCK_Q)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    bt_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
    # Tiles wholly at or before the block's first query position need no mask at all.
    num_full = (ctx_len + qb * BLOCK_Q + 1) // TILE_N
    tile_lo = 0
    tile_hi = tl.cdiv(kv_end, TILE_N)
    if SPLIT:
        split = tl.program_id(2)
        per_split = tl.cdiv(tile_hi, num_splits)
        tile_lo = split * per_split
        tile_hi = tl.minimum(tile_lo + per_split, tile_hi)
    for t in range(tile_lo, tl.minimum(num_full, tile_hi)):
        m, l, acc = _attend_tile(q, m, l, acc, q_pos, t * TILE_N, kv_end, bt_row, k_cache_ptr, v_cache_ptr,
                                 kvh, scale_log2, stride_cb, stride_cs, stride_ch, HEAD_DIM, BLOCK_SIZE, TILE_N,
                                 PRECISION, UPCAST, False, KV_FP8)
    for t in range(tl.maximum(num_full, tile_lo), tile_hi):
        m, l, acc = _attend_tile(q, m, l, acc, q_pos, t * TILE_N, kv_end, bt_row, k_cache_ptr, v_cache_ptr,
                                 kvh, scale_log2, stride_cb, stride_cs, stride_ch, HEAD_DIM, BLOCK_SIZE, TILE_N,
                                 PRECISION, UPCAST, True, KV_FP8)

    if KV_FP8:
        acc = acc * v_scale
    if SPLIT:
        # The decode kernel's partial layout with tokens for sequences: [T, Hq, num_splits, ...]. An
        # empty split (past kv_end) stores m = -inf, l = 0, which the merge weighs as nothing.
        prow = (q_tok * (G * tl.num_programs(1)) + head) * num_splits + split
        tl.store(part_acc_ptr + prow[:, None] * HEAD_DIM + d[None, :], acc, mask=row_mask[:, None])
        tl.store(part_ml_ptr + prow * 2, m, mask=row_mask)
        tl.store(part_ml_ptr + prow * 2 + 1, l, mask=row_mask)
    else:
        l = tl.where(l > 0.0, l, 1.0)
        o = acc / l[:, None]
        tl.store(out_ptr + q_tok[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :],
                 o.to(out_ptr.dtype.element_ty), mask=row_mask[:, None])


def prefill_config(head_dim: int, dtype: torch.dtype, group_pad: int) -> dict:
    """Rows per program (query tokens x padded GQA group), key tile, warps and pipeline depth."""
    if dtype == torch.float32:  # correctness-only path: keep shared memory and registers small
        cfg = dict(BLOCK_M=32, TILE_N=32, num_warps=4, num_stages=1)
    elif head_dim <= 64:
        # The --tune sweep of benchmarks/paged_attention.py on the H200 at 16k tokens (0.5b heads):
        # 207 TFLOP/s against 194 with 4 warps / 3 stages.
        cfg = dict(BLOCK_M=128, TILE_N=64, num_warps=8, num_stages=3)
    elif head_dim <= 128:
        # Same sweep, 7b heads: 249 TFLOP/s against 211 with TILE_N 64 / 8 warps / 2 stages.
        cfg = dict(BLOCK_M=128, TILE_N=32, num_warps=4, num_stages=3)
    else:
        cfg = dict(BLOCK_M=64, TILE_N=32, num_warps=8, num_stages=2)
    cfg["BLOCK_M"] = max(cfg["BLOCK_M"], group_pad)
    return cfg


def prefill_programs_per_kv_head(num_tokens: int, num_seqs: int, num_heads: int, num_kv_heads: int, head_dim: int,
                                 dtype: torch.dtype, config: Optional[dict] = None) -> int:
    """The first grid axis of :func:`paged_prefill` (query blocks, plus one per sequence for ragged ends)."""
    group_pad = next_pow2(num_heads // num_kv_heads)
    cfg = config or prefill_config(head_dim, dtype, group_pad)
    return num_tokens // (cfg["BLOCK_M"] // group_pad) + num_seqs


def paged_prefill(
    query: torch.Tensor,  # [T, Hq, D]
    key_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [>= S, max_blocks] int32
    seq_lens: torch.Tensor,  # [>= S] int32, context length after this step
    query_start_loc: torch.Tensor,  # [>= S + 1] int32
    num_seqs: int,
    scale: float,
    out: Optional[torch.Tensor] = None,  # [T, Hq, D], query dtype
    config: Optional[dict] = None,  # BLOCK_M / TILE_N / num_warps / num_stages override (benchmarks)
    max_seq_len: Optional[int] = None,  # host bound on seq_lens; lets a small grid split the context
    num_splits: Optional[int] = None,  # fix it; None = heuristic from max_seq_len (1 without it)
    k_scale: float = 1.0,  # fp8 cache: key = stored * k_scale (ignored for another cache dtype)
    v_scale: float = 1.0,
) -> torch.Tensor:
    """Causal attention of ragged query chunks over their paged contexts. Returns [T, Hq, D]."""
    block_size, num_kv_heads, head_dim = check_paged_query(query, key_cache, value_cache, block_tables, seq_lens, "T")
    kv_fp8 = key_cache.dtype == FP8_DTYPE
    if kv_fp8:
        check_kv_scales(k_scale, v_scale)
    num_tokens, num_heads, _ = query.shape
    check_int_vector(query_start_loc, "query_start_loc", torch.int32, query.device)
    if not (block_tables.shape[0] >= num_seqs and seq_lens.shape[0] >= num_seqs and query_start_loc.shape[0] >= num_seqs + 1):
        raise ValueError("block_tables/seq_lens/query_start_loc are shorter than num_seqs")
    if out is None:
        out = torch.empty_like(query)
    if not (out.shape == query.shape and out.dtype == query.dtype and out.stride(-1) == 1):
        raise ValueError("bad out tensor")
    if num_tokens == 0 or num_seqs == 0:
        return out
    group = num_heads // num_kv_heads
    group_pad = next_pow2(group)
    cfg = dict(config) if config else prefill_config(head_dim, query.dtype, group_pad)
    programs_per_kv_head = prefill_programs_per_kv_head(num_tokens, num_seqs, num_heads, num_kv_heads, head_dim,
                                                        query.dtype, cfg)
    if num_splits is None:
        num_splits = (1 if max_seq_len is None
                      else choose_num_splits(programs_per_kv_head, num_kv_heads, max_seq_len, query.device))
    part_acc, part_ml = split_partials(out, num_splits)  # checks num_splits
    split = num_splits > 1
    _prefill_kernel[(programs_per_kv_head, num_kv_heads, num_splits)](
        query, key_cache, value_cache, out, part_acc, part_ml, block_tables, seq_lens, query_start_loc,
        scale * (k_scale if kv_fp8 else 1.0) * LOG2E, float(v_scale) if kv_fp8 else 1.0, num_seqs, num_splits,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        block_tables.stride(0),
        G=group, G_PAD=group_pad, HEAD_DIM=head_dim, BLOCK_SIZE=block_size,
        BLOCK_M=cfg["BLOCK_M"], TILE_N=cfg["TILE_N"], PRECISION="ieee" if query.dtype == torch.float32 else "tf32",
        UPCAST=query.dtype == torch.bfloat16 and _INTERPRET, SPLIT=split, KV_FP8=kv_fp8,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    if split:
        merge_splits(out, part_acc, part_ml, num_splits)
    return out


def paged_prefill_reference(query, key_cache, value_cache, block_tables, seq_lens, query_start_loc, num_seqs, scale,
                            k_scale: float = 1.0, v_scale: float = 1.0):
    """Pure-torch reference of :func:`paged_prefill` (gathers per sequence; syncs; tests only); an fp8
    cache is dequantized to float32 first."""
    from aioinfer.attention.dense import dense_causal_attention
    from aioinfer.attention.fp8_kv import dequantize, raw_bytes

    block_size, num_kv_heads, head_dim = key_cache.shape[1:]
    out = torch.empty_like(query)
    qsl = query_start_loc[: num_seqs + 1].tolist()
    for i, n in enumerate(seq_lens[:num_seqs].tolist()):
        s, e = qsl[i], qsl[i + 1]
        if e == s:
            continue
        blocks = block_tables[i, : -(-n // block_size)].long()
        k = raw_bytes(key_cache)[blocks].view(key_cache.dtype).reshape(-1, num_kv_heads, head_dim)[:n]
        v = raw_bytes(value_cache)[blocks].view(value_cache.dtype).reshape(-1, num_kv_heads, head_dim)[:n]
        k, v = dequantize(k, k_scale), dequantize(v, v_scale)  # float32 (fp8: times the scale)
        out[s:e] = dense_causal_attention(query[s:e], k, v, scale)
    return out
