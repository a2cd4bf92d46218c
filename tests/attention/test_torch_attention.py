"""Torch paged attention backend vs plain dense softmax attention on contiguous tensors."""

from __future__ import annotations

import pytest
import torch

from aioinfer.attention.registry import get_attention_backend
from attn_helpers import make_metadata, shuffled_blocks


def dense_reference(q, k, v, scale):
    """q [L, Hq, D] (the last L positions), k/v [S, Hkv, D]: repeat kv heads, mask, softmax."""
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1).double()
    v = v.repeat_interleave(group, dim=1).double()
    scores = torch.einsum("lhd,shd->hls", q.double(), k) * scale
    offset = k.shape[0] - q.shape[0]
    mask = torch.ones(q.shape[0], k.shape[0], dtype=torch.bool).tril(diagonal=offset)
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.einsum("hls,shd->lhd", scores.softmax(-1), v)


def _run(seqs_lens, block_size, num_heads, num_kv_heads, head_dim=16, dtype=torch.float32, seed=0):
    """seqs_lens: list of (num_computed, num_new). Returns (backend output, reference) [T, Hq, D]."""
    g = torch.Generator().manual_seed(seed)
    backend = get_attention_backend("torch")
    need = [-(-(c + n) // block_size) for c, n in seqs_lens]
    num_blocks = sum(need) + 3
    perm = shuffled_blocks(num_blocks, seed)
    seqs, start = [], 0
    for (c, n), nb in zip(seqs_lens, need):
        seqs.append((c, n, perm[start : start + nb]))
        start += nb
    key_cache = torch.full((num_blocks, block_size, num_kv_heads, head_dim), float("nan"), dtype=dtype)
    value_cache = key_cache.clone()
    # NaN everywhere not written: reading any slot beyond a sequence's context would poison the output.
    ks, vs, qs = [], [], []
    for c, n, blocks in seqs:
        total = c + n
        k = torch.randn(total, num_kv_heads, head_dim, generator=g).to(dtype)
        v = torch.randn(total, num_kv_heads, head_dim, generator=g).to(dtype)
        q = torch.randn(n, num_heads, head_dim, generator=g).to(dtype)
        # Earlier steps wrote the cached prefix ...
        if c:
            md = make_metadata([(0, c, blocks)], block_size)
            backend.write_kv(k[:c], v[:c], key_cache, value_cache, md.slot_mapping)
        ks.append(k), vs.append(v), qs.append(q)
    # ... and this step writes the new tokens of every sequence at once, then attends.
    md = make_metadata(seqs, block_size)
    new_k = torch.cat([k[c:] for k, (c, _, _) in zip(ks, seqs)])
    new_v = torch.cat([v[c:] for v, (c, _, _) in zip(vs, seqs)])
    backend.write_kv(new_k, new_v, key_cache, value_cache, md.slot_mapping)
    scale = head_dim**-0.5
    out = backend.forward(torch.cat(qs), key_cache, value_cache, md, scale)
    ref = torch.cat([dense_reference(q, k, v, scale) for q, k, v in zip(qs, ks, vs)])
    return out, ref


@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (8, 1), (6, 2)])
def test_prefill_ragged_block_boundaries(block_size, heads):
    bs = block_size
    lens = [(0, 1), (0, bs - 1), (0, bs), (0, bs + 1), (0, 2 * bs + 3)]
    out, ref = _run(lens, bs, *heads)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("block_size", [4, 16])
def test_decode_and_chunked_prefill_mixed(block_size):
    bs = block_size
    lens = [(bs - 1, 1), (bs, 1), (bs + 1, 1), (5, 7), (2 * bs, bs), (0, 9), (3 * bs - 2, 5)]
    out, ref = _run(lens, bs, 8, 2)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)


def test_many_blocks_and_bf16():
    out, ref = _run([(200, 3), (0, 70), (63, 1)], 16, 4, 2, head_dim=32, dtype=torch.bfloat16)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), ref, atol=3e-2, rtol=3e-2)


def test_write_kv_slots():
    backend = get_attention_backend("torch")
    kc = torch.zeros(3, 4, 2, 8)
    vc = torch.zeros(3, 4, 2, 8)
    key = torch.randn(5, 2, 8)
    slots = torch.tensor([9, 10, 11, 0, 1])  # block 2 offsets 1..3, then block 0 offsets 0..1
    backend.write_kv(key, -key, kc, vc, slots)
    torch.testing.assert_close(kc[2, 1:4], key[:3])
    torch.testing.assert_close(kc[0, 0:2], key[3:])
    torch.testing.assert_close(vc[2, 1:4], -key[:3])
    assert kc[1].abs().sum() == 0


def test_forward_no_cache_matches_reference():
    g = torch.Generator().manual_seed(1)
    backend = get_attention_backend("torch")
    lens = [3, 1, 9]
    md = make_metadata([(0, n, [0, 1, 2]) for n in lens], 4)
    q = torch.randn(sum(lens), 4, 16, generator=g)
    k = torch.randn(sum(lens), 2, 16, generator=g)
    v = torch.randn(sum(lens), 2, 16, generator=g)
    out = backend.forward_no_cache(q, k, v, md, 0.25)
    s = 0
    for n in lens:
        torch.testing.assert_close(
            out[s : s + n].double(),
            dense_reference(q[s : s + n], k[s : s + n], v[s : s + n], 0.25),
            atol=1e-5, rtol=1e-5,
        )
        s += n


def test_backend_factory():
    from aioinfer.attention.backend import AttentionBackendUnavailable

    with pytest.raises(ValueError):
        get_attention_backend("nope")
    assert get_attention_backend("auto", torch.device("cpu")).name == "torch"
    try:
        import triton  # noqa: F401
    except ImportError:
        with pytest.raises(AttentionBackendUnavailable):
            get_attention_backend("triton")
