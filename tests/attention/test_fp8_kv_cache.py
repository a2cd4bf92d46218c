"""The fp8 KV cache on CPU, no kernels: the number format (attention/fp8_kv.py) and the torch backend
writing and reading a float8_e4m3fn cache, against float32 attention.

Two oracles, two tolerances:
- the same attention on the *dequantized* cache (``stored.float() * scale``): what the backend must
  compute exactly, up to float32 summation order: 1e-5;
- float32 attention on the *original* K/V (what a float32 cache would give): the fp8 rounding error
  itself. e4m3 keeps 3 mantissa bits, so a stored value is within 2^-4 = 6.25 % of its input (round to
  nearest); with K, V and Q ~ N(0, 1), head_dim 32, the outputs (convex mixes of V, |out| < ~3)
  differed by at most 0.21 and by at most 0.011 on average over 90 random cases of the shapes below:
  the bounds are 0.3 and 0.02.
"""

from __future__ import annotations

import pytest
import torch

from aioinfer.attention.dense import dense_causal_attention
from aioinfer.attention.fp8_kv import FP8_DTYPE, FP8_MAX, dequantize, inverse_scale, quantize, raw_bytes, zeros
from aioinfer.attention.registry import get_attention_backend
from attn_helpers import make_metadata, shuffled_blocks

MAX_ERR = 0.3  # max abs difference against float32 attention on the original K/V
MEAN_ERR = 0.02  # mean abs difference, same


# ----------------------------------------------------------------------------- the number format


def test_quantize_rounds_to_nearest_within_half_an_ulp_and_clamps():
    x = torch.randn(4096, generator=torch.Generator().manual_seed(0)) * 4
    for scale in (1.0, 0.05, 3.0):
        stored = quantize(x, scale)
        assert stored.dtype == FP8_DTYPE
        back = dequantize(stored, scale)
        normal = (x / scale).abs() >= 2**-6  # e4m3's smallest normal; below it the step is absolute (2^-9)
        rel = ((back - x).abs() / x.abs())[normal]
        assert rel.max() <= 2**-4 + 1e-6, (scale, rel.max())
        assert ((back - x).abs()[~normal] <= scale * 2**-10 + 1e-9).all()
    # out of range: clamped to the largest finite value, never inf or NaN (e4m3fn has no inf)
    big = torch.tensor([1e6, -1e6, 449.0, 448.0, float("inf")])
    assert quantize(big, 1.0).float().tolist() == [FP8_MAX, -FP8_MAX, FP8_MAX, FP8_MAX, FP8_MAX]
    assert quantize(torch.tensor([900.0]), 2.0).float().item() == 448.0  # 900 / 2 fits: 448 is the nearest
    # values already on the grid come back exactly, whatever the input dtype
    grid = torch.tensor([0.0, 1.0, -1.5, 0.875, 448.0, 2**-9, 240.0])
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        assert torch.equal(dequantize(quantize(grid.to(dtype), 1.0, ), 1.0), grid)
    assert inverse_scale(0.1) == pytest.approx(10.0, rel=1e-7)
    with pytest.raises(ValueError, match="> 0"):
        inverse_scale(0.0)


def test_zeros_and_raw_bytes():
    t = zeros((3, 4), FP8_DTYPE, "cpu")
    assert t.dtype == FP8_DTYPE and (t.float() == 0).all()
    assert raw_bytes(t).dtype == torch.uint8 and raw_bytes(t).data_ptr() == t.data_ptr()
    f = torch.ones(2)
    assert raw_bytes(f) is f


# ----------------------------------------------------------------------------- the torch backend


def _case(seqs_lens, block_size, num_heads, num_kv_heads, head_dim, k_scale, v_scale, seed, kv_std=1.0,
          query_dtype=torch.float32):
    # queries shrink as K grows, so that the scores (and the softmax's sharpness) stay those of unit K
    """A paged fp8 case written through the backend in two steps (a cached prefix, then the new tokens
    of every sequence at once). Returns (out, ref on dequantized cache, ref on original K/V)."""
    g = torch.Generator().manual_seed(seed)
    backend = get_attention_backend("torch")
    need = [-(-(c + n) // block_size) for c, n in seqs_lens]
    num_blocks = sum(need) + 3
    perm = shuffled_blocks(num_blocks, seed)
    seqs, start = [], 0
    for (c, n), nb in zip(seqs_lens, need):
        seqs.append((c, n, perm[start : start + nb]))
        start += nb
    # NaN bytes (0x7f) everywhere not written: a read past a context poisons the output
    key_cache = torch.full((num_blocks, block_size, num_kv_heads, head_dim), 0x7F, dtype=torch.uint8).view(FP8_DTYPE)
    value_cache = key_cache.clone()
    ks, vs, qs = [], [], []
    for c, n, blocks in seqs:
        k = torch.randn(c + n, num_kv_heads, head_dim, generator=g) * kv_std
        v = torch.randn(c + n, num_kv_heads, head_dim, generator=g) * kv_std
        qs.append((torch.randn(n, num_heads, head_dim, generator=g) / kv_std).to(query_dtype))
        if c:
            md = make_metadata([(0, c, blocks)], block_size)
            backend.write_kv(k[:c].to(query_dtype), v[:c].to(query_dtype), key_cache, value_cache, md.slot_mapping,
                             k_scale, v_scale)
        ks.append(k), vs.append(v)
    md = make_metadata(seqs, block_size)
    new_k = torch.cat([k[c:] for k, (c, _, _) in zip(ks, seqs)]).to(query_dtype)
    new_v = torch.cat([v[c:] for v, (c, _, _) in zip(vs, seqs)]).to(query_dtype)
    backend.write_kv(new_k, new_v, key_cache, value_cache, md.slot_mapping, k_scale, v_scale)
    scale = head_dim**-0.5
    out = backend.forward(torch.cat(qs), key_cache, value_cache, md, scale, k_scale, v_scale)
    deq, orig = [], []
    for q, k, v in zip(qs, ks, vs):
        kq = dequantize(quantize(k.to(query_dtype), k_scale), k_scale)
        vq = dequantize(quantize(v.to(query_dtype), v_scale), v_scale)
        deq.append(dense_causal_attention(q.float(), kq, vq, scale))
        orig.append(dense_causal_attention(q.float(), k, v, scale))
    return out, torch.cat(deq), torch.cat(orig)


@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("heads", [(4, 4), (8, 2), (6, 1)])
def test_torch_backend_fp8_prefill_decode_mixed(block_size, heads):
    bs = block_size
    lens = [(0, 1), (0, bs + 1), (bs - 1, 1), (bs, 1), (5, 7), (2 * bs, bs), (0, 2 * bs + 3), (3 * bs - 2, 5)]
    out, ref_deq, ref = _case(lens, bs, *heads, 32, 1.0, 1.0, seed=block_size + heads[0])
    assert out.dtype == torch.float32 and not torch.isnan(out).any()
    torch.testing.assert_close(out, ref_deq, atol=1e-5, rtol=1e-5)
    err = (out - ref).abs()
    assert err.max() <= MAX_ERR and err.mean() <= MEAN_ERR, (err.max().item(), err.mean().item())


@pytest.mark.parametrize("kv_std, k_scale, v_scale", [(10.0, 0.12, 0.11), (0.01, 1e-4, 2e-4), (1.0, 1.0, 1.0)],
                         ids=["large-values", "small-values", "unit"])
def test_torch_backend_fp8_applies_the_scales(kv_std, k_scale, v_scale):
    """Calibrated scales bring values far from e4m3's sweet spot back to it (10 * N(0,1) / 0.12 stays
    under 448 up to 5 sigma; 0.01 * N(0,1) / 1e-4 is nowhere near the subnormals); with queries scaled inversely
    (the same scores), the output error relative to V's size is then the unit case's."""
    lens = [(0, 9), (20, 1), (13, 6)]
    out, ref_deq, ref = _case(lens, 8, 8, 2, 32, k_scale, v_scale, seed=3, kv_std=kv_std)
    torch.testing.assert_close(out, ref_deq, atol=1e-5 * kv_std, rtol=1e-5)
    err = (out - ref).abs() / kv_std
    assert err.max() <= MAX_ERR and err.mean() <= MEAN_ERR, (err.max(), err.mean())


def test_torch_backend_fp8_with_bf16_queries():
    out, ref_deq, ref = _case([(0, 17), (30, 1), (7, 9)], 16, 4, 2, 32, 1.0, 1.0, seed=5, query_dtype=torch.bfloat16)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref_deq, atol=2e-2, rtol=2e-2)  # bf16 output rounding
    assert (out.float() - ref).abs().max() <= MAX_ERR


def test_write_kv_stores_the_quantized_bytes_and_ignores_scales_for_other_caches():
    backend = get_attention_backend("torch")
    key = torch.randn(5, 2, 8) * 3
    slots = torch.tensor([9, 10, 11, 0, 1])  # block 2 offsets 1..3, then block 0 offsets 0..1
    kc, vc = zeros((3, 4, 2, 8), FP8_DTYPE, "cpu"), zeros((3, 4, 2, 8), FP8_DTYPE, "cpu")
    backend.write_kv(key, -key, kc, vc, slots, 0.5, 0.25)
    assert torch.equal(raw_bytes(kc[2, 1:4]), raw_bytes(quantize(key[:3], 0.5)))
    assert torch.equal(raw_bytes(kc[0, 0:2]), raw_bytes(quantize(key[3:], 0.5)))
    assert torch.equal(raw_bytes(vc[2, 1:4]), raw_bytes(quantize(-key[:3], 0.25)))
    assert (raw_bytes(kc[1]) == 0).all()
    # a float32 cache: the scales change nothing, on write or read
    fc, fv = torch.zeros(3, 4, 2, 8), torch.zeros(3, 4, 2, 8)
    backend.write_kv(key, -key, fc, fv, slots, 0.5, 0.25)
    assert torch.equal(fc[2, 1:4], key[:3])
    md = make_metadata([(0, 5, [2, 0])], 4)
    q = torch.randn(5, 4, 8)
    fc.zero_(), fv.zero_()
    backend.write_kv(key, -key, fc, fv, md.slot_mapping)
    assert torch.equal(backend.forward(q, fc, fv, md, 0.3, 0.5, 0.25), backend.forward(q, fc, fv, md, 0.3))
