"""The Triton paged-attention kernels over an fp8 (float8_e4m3fn) KV cache, against torch references.

- kv_write: the bytes the kernel stores equal ``write_kv_reference``'s (``clamp(x * (1/scale), ±448)``
  rounded to nearest even: the GPU's cvt.rn.satfinite does what torch's cast does), for fp16, bf16 and
  fp32 inputs, unit and calibrated scales, padded (-1) slots and the last slot of a large pool.
- decode and prefill: the cache is written by the torch reference (so that these tests see the read
  path alone), the oracle is float32 causal attention on the *dequantized* cache
  (``stored.float() * scale``). An e4m3 value converts exactly to fp16, bf16 and fp32, and the scales
  are folded outside the tiles, so the kernels' error is that of a cache of the query dtype: the same
  tolerances as tests/attention/test_triton_attention.py (max abs difference for outputs of size ~1:
  fp32 1e-4, fp16 6e-3, bf16 2.5e-2), taken relative to V's size where the values are scaled.
  Caches hold NaN bytes (0x7f) outside the written contexts and outputs are NaN-poisoned, so a read
  past a context or an unwritten row fails.

The full set is marked `gpu`. On a CPU machine with triton installed (not CI's), the interpreter
(TRITON_INTERPRET=1) runs a reduced set: its software fp32 -> fp8 conversion loses the carry of some
roundings (1.98 stored as 1.0 where the hardware and torch give 2.0), so there the write test only
checks that nearly every byte agrees; the read kernels do not depend on it.
"""

from __future__ import annotations

import os
import random

import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the first @triton.jit of our kernels
pytest.importorskip("triton")

from aioinfer.attention.dense import dense_causal_attention  # noqa: E402
from aioinfer.attention.fp8_kv import FP8_DTYPE, dequantize, quantize, raw_bytes  # noqa: E402
from aioinfer.attention.registry import get_attention_backend  # noqa: E402
from aioinfer.attention.triton_ops.decode import _decode_kernel, paged_decode  # noqa: E402
from aioinfer.attention.triton_ops.kv_write import write_kv, write_kv_reference  # noqa: E402
from aioinfer.attention.triton_ops.prefill import paged_prefill  # noqa: E402
from attn_helpers import make_metadata  # noqa: E402

TOL = {torch.float32: 1e-4, torch.float16: 6e-3, torch.bfloat16: 2.5e-2}
GPU_POOL = 32768  # blocks: offsets past int32 if a kernel forgets int64
DEV = "cuda" if CUDA else "cpu"
NAN_BYTE = 0x7F  # e4m3fn NaN
_interpreted = type(_decode_kernel).__name__ == "InterpretedFunction"
interp = pytest.mark.skipif(CUDA or not _interpreted, reason="interpreter tests run only on CPU-only machines")
# (K and V size, k_scale, v_scale): unit values and scale 1.0 (vLLM's default), and values of size 8
# with calibrated scales (8 * 5 sigma / 0.1 = 400 < 448)
SCALES = [(1.0, 1.0, 1.0), (8.0, 0.1, 0.09)]


def _nan_cache(num_blocks, block_size, num_kv_heads, head_dim):
    return torch.full((num_blocks, block_size, num_kv_heads, head_dim), NAN_BYTE, dtype=torch.uint8,
                      device=DEV).view(FP8_DTYPE)


def _build(seqs, block_size, num_heads, num_kv_heads, head_dim, dtype, num_blocks, seed, kv_std=1.0, k_scale=1.0,
           v_scale=1.0, pad_rows=0):
    """A paged fp8 case. seqs: (num_computed, num_new) per sequence; ``pad_rows`` extra decode rows of
    context 0 (CUDA-graph padding). Queries are scaled by 1 / kv_std so that scores stay those of unit K."""
    g = torch.Generator(device=DEV).manual_seed(seed)
    rng = random.Random(seed)
    need = [-(-(c + n) // block_size) for c, n in seqs]
    assert sum(need) < num_blocks
    ids = list(range(1, num_blocks))
    rng.shuffle(ids)
    tables, start = [], 0
    for nb in need:
        tables.append(ids[start : start + nb])
        start += nb
    key_cache = _nan_cache(num_blocks, block_size, num_kv_heads, head_dim)
    value_cache = _nan_cache(num_blocks, block_size, num_kv_heads, head_dim)
    qs, refs = [], []
    scale = head_dim**-0.5
    for (c, n), blocks in zip(seqs, tables):
        k = (torch.randn(c + n, num_kv_heads, head_dim, generator=g, device=DEV) * kv_std).to(dtype)
        v = (torch.randn(c + n, num_kv_heads, head_dim, generator=g, device=DEV) * kv_std).to(dtype)
        q = (torch.randn(n, num_heads, head_dim, generator=g, device=DEV) / kv_std).to(dtype)
        md = make_metadata([(0, c + n, blocks)], block_size, DEV)
        write_kv_reference(k, v, key_cache, value_cache, md.slot_mapping, k_scale, v_scale)
        kq = dequantize(quantize(k, k_scale), k_scale)  # what the cache holds, as float32
        vq = dequantize(quantize(v, v_scale), v_scale)
        qs.append(q)
        refs.append(dense_causal_attention(q.float(), kq, vq, scale))
    full = [(c, n, b) for (c, n), b in zip(seqs, tables)] + [(0, 0, [0])] * pad_rows
    md = make_metadata([x if x[1] else (0, 1, [0]) for x in full], block_size, DEV)
    if pad_rows:
        md.seq_lens[len(seqs):] = 0
        md.slot_mapping[md.num_tokens - pad_rows:] = -1
        md.max_seq_len = max(c + n for c, n in seqs)
    query = torch.cat(qs + [torch.randn(pad_rows, num_heads, head_dim, device=DEV).to(dtype)])
    ref = torch.cat(refs + [torch.zeros(pad_rows, num_heads, head_dim, device=DEV)])
    return dict(md=md, kc=key_cache, vc=value_cache, q=query, ref=ref, scale=scale, kv_std=kv_std,
                k_scale=k_scale, v_scale=v_scale)


def _assert_close(out, case, dtype):
    assert not torch.isnan(out).any(), "NaN in output: unwritten row or a read past the context"
    err = ((out.float() - case["ref"].float()).abs().max() / case["kv_std"]).item()
    assert err <= TOL[dtype], f"max abs err {err:.3g} (relative to V's size) > {TOL[dtype]} ({dtype})"


def _decode(case, num_splits=None):
    md = case["md"]
    out = torch.full_like(case["q"], float("nan"))
    paged_decode(case["q"], case["kc"], case["vc"], md.block_tables, md.seq_lens, case["scale"],
                 max_seq_len=md.max_seq_len, num_splits=num_splits, out=out, k_scale=case["k_scale"],
                 v_scale=case["v_scale"])
    return out


def _prefill(case, num_splits=None, max_seq_len=None):
    md = case["md"]
    out = torch.full_like(case["q"], float("nan"))
    paged_prefill(case["q"], case["kc"], case["vc"], md.block_tables, md.seq_lens, md.query_start_loc,
                  md.num_seqs, case["scale"], out=out, max_seq_len=max_seq_len, num_splits=num_splits,
                  k_scale=case["k_scale"], v_scale=case["v_scale"])
    return out


def _decode_lens(bs, long):
    return [1, bs - 1, bs, bs + 1, 2 * bs + 3, long, long + 37, 5, 64, 3 * bs, 7, 100, bs * 8 - 1, 1, 2, long // 2, 33]


def _mixed_seqs(bs, long):
    return [(0, 1), (bs - 1, 1), (bs, 1), (0, bs - 1), (0, bs), (0, bs + 1), (bs + 1, 1), (37, 130),
            (long, 64), (0, 300), (2 * bs, bs), (long + 5, 1), (3, 2 * bs + 1)]


def _check_write_kv(dtype, num_blocks, block_size, num_kv_heads, head_dim, num_tokens, k_scale, v_scale, kv_std,
                    exact=True):
    g = torch.Generator(device=DEV).manual_seed(num_tokens)
    kc = _nan_cache(num_blocks, block_size, num_kv_heads, head_dim)
    vc = _nan_cache(num_blocks, block_size, num_kv_heads, head_dim)
    slots = torch.randperm(num_blocks * block_size, generator=g, device=DEV)[:num_tokens]
    slots[::7] = -1  # padded rows write nothing
    slots[-1] = num_blocks * block_size - 1
    qkv = (torch.randn(num_tokens, 3 * num_kv_heads, head_dim, generator=g, device=DEV) * kv_std).to(dtype)
    qkv[0, num_kv_heads, 0] = 1e4 * kv_std  # past 448 * scale: clamped, not inf or NaN
    key, value = qkv[:, :num_kv_heads], qkv[:, num_kv_heads : 2 * num_kv_heads]  # strided views
    kc2, vc2 = kc.clone(), vc.clone()
    write_kv(key, value, kc, vc, slots, k_scale, v_scale)
    write_kv_reference(key, value, kc2, vc2, slots, k_scale, v_scale)
    for got, want in ((kc, kc2), (vc, vc2)):
        same = raw_bytes(got) == raw_bytes(want)
        if exact:
            assert same.all(), f"{(~same).sum().item()} bytes differ from the reference"
        else:  # the interpreter's conversion (module docstring)
            assert same.float().mean() >= 0.95, same.float().mean()
            assert not torch.isnan(got.float()[raw_bytes(want) != NAN_BYTE]).any()


# ----------------------------------------------------------------------------- GPU (full set)

HEADS = [(14, 2), (28, 4), (8, 8)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=["fp16", "bf16", "fp32"])
@pytest.mark.parametrize("kv_std, k_scale, v_scale", SCALES, ids=["unit", "calibrated"])
def test_gpu_fp8_write_kv(dtype, kv_std, k_scale, v_scale):
    _check_write_kv(dtype, GPU_POOL, 16, 4, 128, 4099, k_scale, v_scale, kv_std)
    _check_write_kv(dtype, 64, 16, 2, 64, 70, k_scale, v_scale, kv_std)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("heads", HEADS, ids=lambda h: f"{h[0]}q{h[1]}kv")
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("kv_std, k_scale, v_scale", SCALES, ids=["unit", "calibrated"])
def test_gpu_fp8_decode(dtype, heads, head_dim, kv_std, k_scale, v_scale):
    seed = hash((str(dtype), heads, head_dim, kv_std)) % 10_000
    case = _build([(n - 1, 1) for n in _decode_lens(16, 1500)], 16, *heads, head_dim, dtype, GPU_POOL, seed,
                  kv_std, k_scale, v_scale, pad_rows=2)
    for splits in (None, 1, 7, 64):
        _assert_close(_decode(case, splits), case, dtype)
    case = _build([(3000, 1)], 16, *heads, head_dim, dtype, GPU_POOL, seed + 1, kv_std, k_scale, v_scale)
    _assert_close(_decode(case), case, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("heads", HEADS, ids=lambda h: f"{h[0]}q{h[1]}kv")
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("kv_std, k_scale, v_scale", SCALES, ids=["unit", "calibrated"])
def test_gpu_fp8_prefill_chunked_mixed(dtype, heads, head_dim, block_size, kv_std, k_scale, v_scale):
    seed = hash((str(dtype), heads, head_dim, block_size, kv_std, "p")) % 10_000
    case = _build(_mixed_seqs(block_size, 1100), block_size, *heads, head_dim, dtype, GPU_POOL, seed, kv_std,
                  k_scale, v_scale)
    _assert_close(_prefill(case), case, dtype)
    for splits in (2, 7, 64):
        _assert_close(_prefill(case, num_splits=splits), case, dtype)
    # a prefix-cache hit's step: a short chunk after a long cached context, split by the heuristic
    case = _build([(4096, 32), (3000, 1)], block_size, *heads, head_dim, dtype, GPU_POOL, seed + 1, kv_std,
                  k_scale, v_scale)
    _assert_close(_prefill(case, max_seq_len=case["md"].max_seq_len), case, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [32, 256])
def test_gpu_fp8_fp32_queries_and_other_head_dims(head_dim):
    for dtype in (torch.float32, torch.bfloat16):
        case = _build(_mixed_seqs(16, 700), 16, 4, 2, head_dim, dtype, 4096, head_dim, 8.0, 0.1, 0.09)
        _assert_close(_prefill(case), case, dtype)
        case = _build([(n - 1, 1) for n in _decode_lens(16, 700)], 16, 4, 2, head_dim, dtype, 4096, head_dim + 1)
        _assert_close(_decode(case), case, dtype)
        _assert_close(_decode(case, 5), case, dtype)


@pytest.mark.gpu
def test_gpu_fp8_backend_writes_then_reads_and_auto_is_triton():
    """The backend's own write (the Triton kernel) then its forward, decode and mixed steps: the oracle
    still holds, as the kernel stores the reference's bytes."""
    backend = get_attention_backend("auto", torch.device("cuda"))
    assert backend.name == "triton" and backend.supports_fp8_kv
    for seqs in ([(n - 1, 1) for n in (1, 17, 1200)], _mixed_seqs(16, 1024)):
        case = _build(seqs, 16, 28, 4, 128, torch.bfloat16, GPU_POOL, len(seqs), 8.0, 0.1, 0.09)
        md = case["md"]
        # write the new tokens again through the backend: the same bytes must land in the same slots
        kc, vc = case["kc"], case["vc"]
        before = raw_bytes(kc).clone(), raw_bytes(vc).clone()
        slots = md.slot_mapping
        blocks, offsets = slots // 16, slots % 16
        # the stored values, read back: on the fp8 grid, so requantized exactly (gathered as bytes)
        new_k = dequantize(raw_bytes(kc)[blocks, offsets].view(FP8_DTYPE), 0.1, torch.bfloat16)
        new_v = dequantize(raw_bytes(vc)[blocks, offsets].view(FP8_DTYPE), 0.09, torch.bfloat16)
        backend.write_kv(new_k, new_v, kc, vc, slots, 0.1, 0.09)
        assert torch.equal(raw_bytes(kc), before[0]) and torch.equal(raw_bytes(vc), before[1])
        out = backend.forward(case["q"], kc, vc, md, case["scale"], 0.1, 0.09)
        _assert_close(out, case, torch.bfloat16)


@pytest.mark.gpu
def test_gpu_fp8_decode_cuda_graph_replay_with_new_lengths():
    """One captured decode launch over an fp8 cache (the scales baked in) stays right when lengths,
    tables and cache contents change in place."""
    dtype = torch.bfloat16
    case = _build([(n - 1, 1) for n in (5, 40, 300, 17)], 16, 28, 4, 128, dtype, GPU_POOL, 11, 8.0, 0.1, 0.09)
    md = case["md"]
    bt = torch.zeros(4, 256, dtype=torch.int32, device="cuda")
    bt[:, : md.block_tables.shape[1]] = md.block_tables
    sl = md.seq_lens.clone()
    q = case["q"].clone()
    out = torch.full_like(q, float("nan"))
    run = lambda: paged_decode(q, case["kc"], case["vc"], bt, sl, case["scale"], max_seq_len=4096,  # noqa: E731
                               num_splits=8, out=out, k_scale=0.1, v_scale=0.09)
    run()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    graph.replay()
    torch.cuda.synchronize()
    _assert_close(out, case, dtype)
    case2 = _build([(n - 1, 1) for n in (4000, 1, 16, 2049)], 16, 28, 4, 128, dtype, GPU_POOL, 12, 8.0, 0.1, 0.09)
    raw_bytes(case["kc"]).copy_(raw_bytes(case2["kc"])), raw_bytes(case["vc"]).copy_(raw_bytes(case2["vc"]))
    bt.zero_()
    bt[:, : case2["md"].block_tables.shape[1]] = case2["md"].block_tables
    sl.copy_(case2["md"].seq_lens)
    q.copy_(case2["q"])
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    _assert_close(out, case2, dtype)


def test_wrappers_reject_bad_fp8_arguments():
    kc = torch.zeros(4, 16, 2, 32, dtype=torch.uint8, device=DEV).view(FP8_DTYPE)
    q = torch.zeros(3, 4, 32, dtype=torch.float16, device=DEV)
    bt = torch.zeros(3, 2, dtype=torch.int32, device=DEV)
    sl = torch.ones(3, dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match="k_scale"):
        paged_decode(q, kc, kc, bt, sl, 1.0, 1, k_scale=0.0)
    with pytest.raises(ValueError, match="v_scale"):
        paged_decode(q, kc, kc, bt, sl, 1.0, 1, v_scale=torch.tensor(1.0))  # a tensor would sync
    with pytest.raises(ValueError, match="query dtype"):
        paged_decode(q.to(torch.uint8).view(FP8_DTYPE), kc, kc, bt, sl, 1.0, 1)
    with pytest.raises(ValueError, match="dtypes differ"):
        paged_decode(q, kc, kc.view(torch.uint8), bt, sl, 1.0, 1)
    with pytest.raises(ValueError, match="k_scale"):
        write_kv(q[:, :2], q[:, :2], kc, kc, torch.zeros(3, dtype=torch.int64, device=DEV), k_scale=-1.0)


# ------------------------------------------------------------------ CPU interpreter (reduced)


@interp
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_interp_fp8_write_kv(dtype):
    _check_write_kv(dtype, 64, 16, 2, 32, 70, 0.1, 0.09, 8.0, exact=False)


@interp
@pytest.mark.parametrize("dtype,heads,head_dim,block_size", [(torch.bfloat16, (8, 2), 32, 16),
                                                             (torch.float32, (4, 4), 16, 4)],
                         ids=["bf16-8q2kv-d32-bs16", "fp32-4q4kv-d16-bs4"])
@pytest.mark.parametrize("kv_std, k_scale, v_scale", SCALES, ids=["unit", "calibrated"])
def test_interp_fp8_decode(dtype, heads, head_dim, block_size, kv_std, k_scale, v_scale):
    lens = [1, block_size - 1, block_size, block_size + 1, 300]
    case = _build([(n - 1, 1) for n in lens], block_size, *heads, head_dim, dtype, 256, 3, kv_std, k_scale,
                  v_scale, pad_rows=1)
    for splits in (None, 1, 5):
        _assert_close(_decode(case, splits), case, dtype)


@interp
@pytest.mark.parametrize("dtype,heads,head_dim,block_size", [(torch.bfloat16, (6, 2), 32, 16),
                                                             (torch.float32, (4, 1), 16, 4)],
                         ids=["bf16-6q2kv-d32-bs16", "fp32-4q1kv-d16-bs4"])
@pytest.mark.parametrize("kv_std, k_scale, v_scale", SCALES, ids=["unit", "calibrated"])
def test_interp_fp8_prefill_chunked_mixed(dtype, heads, head_dim, block_size, kv_std, k_scale, v_scale):
    bs = block_size
    seqs = [(0, 1), (bs - 1, 1), (bs, 1), (0, bs + 1), (5, 7), (2 * bs, bs), (70, 40), (3, 2 * bs + 1)]
    case = _build(seqs, bs, *heads, head_dim, dtype, 256, 4, kv_std, k_scale, v_scale)
    _assert_close(_prefill(case), case, dtype)
    for splits in (3, 9):
        _assert_close(_prefill(case, num_splits=splits), case, dtype)
