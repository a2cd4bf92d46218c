"""Triton paged attention kernels against dense softmax attention, on the GPU and (reduced) on CPU.

On a machine without CUDA but with triton, this module turns on the Triton interpreter
(TRITON_INTERPRET=1, before any kernel is defined) and runs a reduced parametrization on CPU
tensors; the full parametrization is marked `gpu`. CI installs no triton: everything skips.

Oracle: per sequence, plain causal softmax attention in float32 on the *contiguous* K/V the test
generated (upcast from the kernel's dtype), independent of the block table. Tolerances on the
max abs difference (outputs are convex mixes of N(0,1) values, so |out| <~ 3):
  fp32 1e-4 (ieee dots), fp16 6e-3, bf16 2.5e-2 (p is rounded to the KV dtype before P@V, and the
  output to the query dtype: bf16 has 8 mantissa bits, so one output ulp near 2 is 1.6e-2).
Caches are NaN-filled outside the written context and outputs NaN-poisoned before each launch, so
a read past a context or an unwritten output row fails the test.
"""

from __future__ import annotations

import os
import random

import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    # Must precede the first @triton.jit of our kernels (decided at decoration time).
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from aioinfer.attention.dense import dense_causal_attention  # noqa: E402
from aioinfer.attention.registry import get_attention_backend  # noqa: E402
from aioinfer.attention.triton_ops.decode import _decode_kernel, paged_decode  # noqa: E402
from aioinfer.attention.triton_ops.kv_write import write_kv, write_kv_reference  # noqa: E402
from aioinfer.attention.triton_ops.prefill import paged_prefill  # noqa: E402
from attn_helpers import make_metadata  # noqa: E402

TOL = {torch.float32: 1e-4, torch.float16: 6e-3, torch.bfloat16: 2.5e-2}
GPU_POOL = 32768  # blocks: block ids * strides overflow int32 offsets if the kernel forgets int64

_interpreted = type(_decode_kernel).__name__ == "InterpretedFunction"
interp = pytest.mark.skipif(
    CUDA or not _interpreted, reason="interpreter tests run only on CPU-only machines (GPU runs the full set)"
)
DEV = "cuda" if CUDA else "cpu"


def _build(seqs, block_size, num_heads, num_kv_heads, head_dim, dtype, num_blocks, seed, pad_rows=0):
    """Random paged case. seqs: (num_computed, num_new) per sequence. Returns a dict with the
    metadata (``pad_rows`` extra decode rows of context 0 and slot -1, like CUDA-graph padding),
    the caches with every sequence's context written (the new tokens through the Triton kernel),
    the queries, and the oracle output."""
    g = torch.Generator(device=DEV).manual_seed(seed)
    rng = random.Random(seed)
    need = [-(-(c + n) // block_size) for c, n in seqs]
    assert sum(need) < num_blocks
    ids = list(range(1, num_blocks))  # block 0 is the null block
    rng.shuffle(ids)
    tables, start = [], 0
    for nb in need:
        tables.append(ids[start : start + nb])
        start += nb
    key_cache = torch.full((num_blocks, block_size, num_kv_heads, head_dim), float("nan"), dtype=dtype, device=DEV)
    value_cache = torch.full_like(key_cache, float("nan"))
    ks, vs, qs = [], [], []
    for (c, n), blocks in zip(seqs, tables):
        k = torch.randn(c + n, num_kv_heads, head_dim, generator=g, device=DEV).to(dtype)
        v = torch.randn(c + n, num_kv_heads, head_dim, generator=g, device=DEV).to(dtype)
        qs.append(torch.randn(n, num_heads, head_dim, generator=g, device=DEV).to(dtype))
        if c:  # an earlier step cached the prefix
            md = make_metadata([(0, c, blocks)], block_size, DEV)
            write_kv_reference(k[:c], v[:c], key_cache, value_cache, md.slot_mapping)
        ks.append(k), vs.append(v)
    full = [(c, n, b) for (c, n), b in zip(seqs, tables)] + [(0, 0, [0])] * pad_rows
    md = make_metadata([x if x[1] else (0, 1, [0]) for x in full], block_size, DEV)
    if pad_rows:  # padded rows: context 0, no new tokens written (slot -1), one query row each
        md.seq_lens[len(seqs):] = 0
        md.slot_mapping[md.num_tokens - pad_rows :] = -1
        md.max_seq_len = max(c + n for c, n in seqs)
    # The new tokens of all sequences at once, as a strided view of a fused qkv-like buffer.
    new_k = torch.cat([k[c:] for k, (c, _) in zip(ks, seqs)] + [torch.randn(pad_rows, num_kv_heads, head_dim,
                                                                            device=DEV).to(dtype)])
    new_v = torch.cat([v[c:] for v, (c, _) in zip(vs, seqs)] + [new_k[:0].new_zeros(pad_rows, num_kv_heads, head_dim)])
    fused = torch.cat([new_k, new_v], dim=1)  # [T, 2*Hkv, D]
    write_kv(fused[:, :num_kv_heads], fused[:, num_kv_heads:], key_cache, value_cache, md.slot_mapping)
    scale = head_dim**-0.5
    query = torch.cat(qs + [torch.randn(pad_rows, num_heads, head_dim, device=DEV).to(dtype)])
    ref = torch.cat([dense_causal_attention(q.float(), k.float(), v.float(), scale) for q, k, v in zip(qs, ks, vs)]
                    + [torch.zeros(pad_rows, num_heads, head_dim, device=DEV)])
    return dict(md=md, kc=key_cache, vc=value_cache, q=query, ref=ref, scale=scale)


def _assert_close(out, ref, dtype, rows=None):
    assert not torch.isnan(out).any(), "NaN in output: unwritten row or a read past the context"
    err = (out.float() - ref.float()).abs().max().item()
    assert err <= TOL[dtype], f"max abs err {err:.3g} > {TOL[dtype]} ({dtype})"


def _decode(case, num_splits=None):
    md = case["md"]
    out = torch.full_like(case["q"], float("nan"))
    paged_decode(case["q"], case["kc"], case["vc"], md.block_tables, md.seq_lens, case["scale"],
                 max_seq_len=md.max_seq_len, num_splits=num_splits, out=out)
    return out


def _prefill(case, num_splits=None, max_seq_len=None):
    """num_splits: fixed split count; else max_seq_len given lets the heuristic split, None runs unsplit."""
    md = case["md"]
    out = torch.full_like(case["q"], float("nan"))
    paged_prefill(case["q"], case["kc"], case["vc"], md.block_tables, md.seq_lens, md.query_start_loc,
                  md.num_seqs, case["scale"], out=out, max_seq_len=max_seq_len, num_splits=num_splits)
    return out


def _decode_lens(bs, long):
    return [1, bs - 1, bs, bs + 1, 2 * bs + 3, long, long + 37, 5, 64, 3 * bs, 7, 100, bs * 8 - 1, 1, 2, long // 2, 33]


def _mixed_seqs(bs, long):
    """Chunked-prefill shapes next to decode rows: fresh prompts, chunks over a cached prefix,
    decode at block boundaries, a long context."""
    return [(0, 1), (bs - 1, 1), (bs, 1), (0, bs - 1), (0, bs), (0, bs + 1), (bs + 1, 1), (37, 130),
            (long, 64), (0, 300), (2 * bs, bs), (long + 5, 1), (3, 2 * bs + 1)]


# ----------------------------------------------------------------------------- GPU (full set)

HEADS = [(14, 2), (28, 4), (8, 8)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("heads", HEADS, ids=lambda h: f"{h[0]}q{h[1]}kv")
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("block_size", [16, 32])
def test_gpu_decode(dtype, heads, head_dim, block_size):
    seed = hash((str(dtype), heads, head_dim, block_size)) % 10_000
    # batch 17 with boundary and > 1000 contexts, plus two CUDA-graph padding rows
    case = _build([(n - 1, 1) for n in _decode_lens(block_size, 1500)], block_size, *heads, head_dim, dtype,
                  GPU_POOL, seed, pad_rows=2)
    for splits in (None, 1, 7, 64):
        _assert_close(_decode(case, splits), case["ref"], dtype)
    # batch 1, long context, heuristic splits
    case = _build([(3000, 1)], block_size, *heads, head_dim, dtype, GPU_POOL, seed + 1)
    _assert_close(_decode(case), case["ref"], dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("heads", HEADS, ids=lambda h: f"{h[0]}q{h[1]}kv")
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("block_size", [16, 32])
def test_gpu_prefill_chunked_mixed(dtype, heads, head_dim, block_size):
    seed = hash((str(dtype), heads, head_dim, block_size, "p")) % 10_000
    case = _build(_mixed_seqs(block_size, 1100), block_size, *heads, head_dim, dtype, GPU_POOL, seed)
    _assert_close(_prefill(case), case["ref"], dtype)
    # Context split ("flash-decoding" for prefill): more splits than some rows have tiles, so empty splits too.
    for splits in (2, 7, 64):
        _assert_close(_prefill(case, num_splits=splits), case["ref"], dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("heads", HEADS, ids=lambda h: f"{h[0]}q{h[1]}kv")
def test_gpu_prefill_short_chunk_long_context_splits(dtype, heads):
    """A prefix-cache hit's step: a short chunk after a long cached context; the heuristic splits the
    context because the grid alone would leave the GPU nearly idle."""
    seqs = [(4096, 32)]
    case = _build(seqs, 16, *heads, 128, dtype, GPU_POOL, 11)
    md = case["md"]
    from aioinfer.attention.triton_ops.decode import choose_num_splits
    assert choose_num_splits(32 // 16 + 1, heads[1], md.max_seq_len, case["q"].device) > 1
    _assert_close(_prefill(case, max_seq_len=md.max_seq_len), case["ref"], dtype)
    # Two hits and a decode row side by side, with the heuristic.
    case = _build([(2048, 17), (3000, 1), (4000, 40)], 16, *heads, 128, dtype, GPU_POOL, 12)
    _assert_close(_prefill(case, max_seq_len=case["md"].max_seq_len), case["ref"], dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("head_dim", [16, 32, 256])
def test_gpu_other_head_dims_and_fp32(dtype, head_dim):
    case = _build(_mixed_seqs(16, 700), 16, 4, 2, head_dim, dtype, 4096, head_dim)
    _assert_close(_prefill(case), case["ref"], dtype)
    case = _build([(n - 1, 1) for n in _decode_lens(16, 700)], 16, 4, 2, head_dim, dtype, 4096, head_dim + 1)
    _assert_close(_decode(case), case["ref"], dtype)
    _assert_close(_decode(case, 5), case["ref"], dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_gpu_backend_dispatch_and_no_cache(dtype):
    backend = get_attention_backend("triton", torch.device("cuda"))
    assert get_attention_backend("auto", torch.device("cuda")).name == "triton"
    for seqs in ([(n - 1, 1) for n in (1, 17, 1200)], _mixed_seqs(16, 1024)):
        case = _build(seqs, 16, 28, 4, 128, dtype, GPU_POOL, len(seqs))
        out = backend.forward(case["q"], case["kc"], case["vc"], case["md"], case["scale"])
        _assert_close(out, case["ref"], dtype)
    _check_no_cache(backend, dtype)


@pytest.mark.gpu
def test_gpu_decode_cuda_graph_replay_with_new_lengths():
    """One captured launch (fixed num_splits) stays right when lengths and tables change in place."""
    dtype, bs, heads, d = torch.bfloat16, 16, (28, 4), 128
    case = _build([(n - 1, 1) for n in (5, 40, 300, 17)], bs, *heads, d, dtype, GPU_POOL, 11)
    md = case["md"]
    bt = torch.zeros(4, 256, dtype=torch.int32, device="cuda")  # room for contexts up to 4096
    bt[:, : md.block_tables.shape[1]] = md.block_tables
    sl = md.seq_lens.clone()
    q = case["q"].clone()
    out = torch.full_like(q, float("nan"))
    run = lambda: paged_decode(q, case["kc"], case["vc"], bt, sl, case["scale"], max_seq_len=4096, num_splits=8, out=out)  # noqa: E731
    run()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    graph.replay()
    torch.cuda.synchronize()
    _assert_close(out, case["ref"], dtype)
    case2 = _build([(n - 1, 1) for n in (4000, 1, 16, 2049)], bs, *heads, d, dtype, GPU_POOL, 12)
    case["kc"].copy_(case2["kc"]), case["vc"].copy_(case2["vc"])
    bt.zero_()
    bt[:, : case2["md"].block_tables.shape[1]] = case2["md"].block_tables
    sl.copy_(case2["md"].seq_lens)
    q.copy_(case2["q"])
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    _assert_close(out, case2["ref"], dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=["fp16", "bf16", "fp32"])
def test_gpu_write_kv(dtype):
    _check_write_kv(dtype, GPU_POOL, 16, 4, 128, num_tokens=4099)


# ------------------------------------------------------------------ CPU interpreter (reduced)


@interp
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
def test_interp_write_kv(dtype):
    _check_write_kv(dtype, 64, 16, 2, 32, num_tokens=70)


@interp
@pytest.mark.parametrize(
    "dtype,heads,head_dim,block_size",
    [(torch.bfloat16, (8, 2), 32, 16), (torch.float32, (4, 4), 16, 4), (torch.float16, (14, 2), 16, 8)],
    ids=["bf16-8q2kv-d32-bs16", "fp32-4q4kv-d16-bs4", "fp16-14q2kv-d16-bs8"],
)
def test_interp_decode(dtype, heads, head_dim, block_size):
    lens = [1, block_size - 1, block_size, block_size + 1, 300]
    case = _build([(n - 1, 1) for n in lens], block_size, *heads, head_dim, dtype, 256, 3, pad_rows=1)
    for splits in (None, 1, 5):
        _assert_close(_decode(case, splits), case["ref"], dtype)


@interp
@pytest.mark.parametrize(
    "dtype,heads,head_dim,block_size",
    [(torch.bfloat16, (6, 2), 32, 16), (torch.float32, (4, 1), 16, 4), (torch.float16, (2, 2), 16, 8)],
    ids=["bf16-6q2kv-d32-bs16", "fp32-4q1kv-d16-bs4", "fp16-2q2kv-d16-bs8"],
)
def test_interp_prefill_chunked_mixed(dtype, heads, head_dim, block_size):
    bs = block_size
    seqs = [(0, 1), (bs - 1, 1), (bs, 1), (0, bs + 1), (5, 7), (2 * bs, bs), (70, 40), (3, 2 * bs + 1)]
    case = _build(seqs, bs, *heads, head_dim, dtype, 256, 4)
    _assert_close(_prefill(case), case["ref"], dtype)
    for splits in (3, 9):  # context split into partials merged afterwards; 9 leaves some splits empty
        _assert_close(_prefill(case, num_splits=splits), case["ref"], dtype)


@interp
def test_interp_backend_dispatch_and_no_cache():
    backend = get_attention_backend("triton", torch.device("cpu"))
    assert backend.name == "triton"
    assert get_attention_backend("auto", torch.device("cpu")).name == "torch"  # auto never picks triton on CPU
    case = _build([(n - 1, 1) for n in (1, 17, 90)], 16, 8, 2, 32, torch.float32, 64, 5)
    _assert_close(backend.forward(case["q"], case["kc"], case["vc"], case["md"], case["scale"]), case["ref"], torch.float32)
    case = _build([(0, 3), (9, 1), (20, 30)], 16, 8, 2, 32, torch.float32, 64, 6)
    _assert_close(backend.forward(case["q"], case["kc"], case["vc"], case["md"], case["scale"]), case["ref"], torch.float32)
    _check_no_cache(backend, torch.float32, head_dim=32)


# ----------------------------------------------------------------------------------- shared


def _check_write_kv(dtype, num_blocks, block_size, num_kv_heads, head_dim, num_tokens):
    g = torch.Generator(device=DEV).manual_seed(num_tokens)
    kc = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=g, device=DEV).to(dtype)
    vc = torch.randn(kc.shape, generator=g, device=DEV).to(dtype)
    slots = torch.randperm(num_blocks * block_size, generator=g, device=DEV)[:num_tokens]
    slots[::7] = -1  # padded rows write nothing
    slots[-1] = num_blocks * block_size - 1  # the very last slot of a large pool
    qkv = torch.randn(num_tokens, 3 * num_kv_heads, head_dim, generator=g, device=DEV).to(dtype)
    key, value = qkv[:, :num_kv_heads], qkv[:, num_kv_heads : 2 * num_kv_heads]  # strided views
    kc2, vc2 = kc.clone(), vc.clone()
    write_kv(key, value, kc, vc, slots)
    write_kv_reference(key, value, kc2, vc2, slots)
    assert torch.equal(kc, kc2) and torch.equal(vc, vc2)


def _check_no_cache(backend, dtype, head_dim=128):
    from aioinfer.attention.backend import AttentionBackend

    lens = [1, 17, 300, 64]
    md = make_metadata([(0, n, [0] * (-(-n // 16))) for n in lens], 16, DEV)
    g = torch.Generator(device=DEV).manual_seed(9)
    q = torch.randn(sum(lens), 8, head_dim, generator=g, device=DEV).to(dtype)
    k = torch.randn(sum(lens), 2, head_dim, generator=g, device=DEV).to(dtype)
    v = torch.randn(sum(lens), 2, head_dim, generator=g, device=DEV).to(dtype)
    out = backend.forward_no_cache(q, k, v, md, head_dim**-0.5)
    ref = AttentionBackend.forward_no_cache(backend, q.float(), k.float(), v.float(), md, head_dim**-0.5)
    _assert_close(out, ref, dtype)


# ----------------------------------------------------------------- wrappers, factory, flash-attn


def test_wrappers_reject_bad_arguments():
    kc = torch.zeros(4, 16, 2, 32, dtype=torch.float16, device=DEV)
    q = torch.zeros(3, 4, 32, dtype=torch.float16, device=DEV)
    bt = torch.zeros(3, 2, dtype=torch.int32, device=DEV)
    sl = torch.ones(3, dtype=torch.int32, device=DEV)
    qsl = torch.arange(4, dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match="dtype"):
        paged_decode(q.float(), kc, kc, bt, sl, 1.0, 1)
    with pytest.raises(ValueError, match="seq_lens"):
        paged_decode(q, kc, kc, bt, sl.long(), 1.0, 1)
    kc_t = kc.transpose(2, 3).contiguous().transpose(2, 3)  # head_dim axis strided
    with pytest.raises(ValueError, match="contiguous"):
        paged_prefill(q, kc_t, kc_t, bt, sl, qsl, 3, 1.0)
    with pytest.raises(ValueError, match="contiguous"):
        paged_decode(q.transpose(1, 2).contiguous().transpose(1, 2), kc, kc, bt, sl, 1.0, 1)
    with pytest.raises(ValueError, match="power of two"):
        paged_prefill(q[..., :24], kc[..., :24], kc[..., :24], bt, sl, qsl, 3, 1.0)
    with pytest.raises(ValueError, match="multiple"):
        paged_decode(q[:, :3], kc, kc, bt, sl, 1.0, 1)
    with pytest.raises(ValueError, match="slot_mapping"):
        write_kv(q[:, :2], q[:, :2], kc, kc, torch.zeros(3, dtype=torch.int32, device=DEV))


def test_flash_attn_unavailable_or_matches():
    from aioinfer.attention.backend import AttentionBackendUnavailable

    try:
        import flash_attn  # noqa: F401
    except ImportError:
        with pytest.raises(AttentionBackendUnavailable):
            get_attention_backend("flash_attn")
        pytest.skip("flash_attn is not installed")
    if not CUDA:
        pytest.skip("needs a CUDA device")
    backend = get_attention_backend("flash_attn", torch.device("cuda"))
    for block_size in (16, 256):  # 16: falls back to the Triton kernels; 256: FA2's paged path
        case = _build(_mixed_seqs(block_size, 1100), block_size, 28, 4, 128, torch.bfloat16, 256, block_size)
        out = backend.forward(case["q"], case["kc"], case["vc"], case["md"], case["scale"])
        _assert_close(out, case["ref"], torch.bfloat16)
