"""Build attention metadata and paged KV caches by hand, for tests that drive models directly."""

from __future__ import annotations

from typing import Sequence

import torch

from aioinfer.attention.metadata import AttentionMetadata


def make_metadata(
    seqs: Sequence[tuple[int, int, Sequence[int]]],
    block_size: int,
    device: torch.device | str = "cpu",
) -> AttentionMetadata:
    """seqs: per sequence (num_computed, num_new, block_ids) — the new tokens are positions
    num_computed .. num_computed+num_new-1, and block_ids must cover the whole context."""
    slots: list[int] = []
    qsl = [0]
    seq_lens: list[int] = []
    max_blocks = max(len(b) for _, _, b in seqs)
    tables = torch.zeros(len(seqs), max(max_blocks, 1), dtype=torch.int32)
    for i, (computed, new, blocks) in enumerate(seqs):
        total = computed + new
        assert len(blocks) * block_size >= total, "block_ids do not cover the context"
        for pos in range(computed, total):
            slots.append(blocks[pos // block_size] * block_size + pos % block_size)
        qsl.append(qsl[-1] + new)
        seq_lens.append(total)
        tables[i, : len(blocks)] = torch.tensor(list(blocks), dtype=torch.int32)
    return AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_tables=tables.to(device),
        num_seqs=len(seqs),
        num_tokens=qsl[-1],
        max_query_len=max(n for _, n, _ in seqs),
        max_seq_len=max(seq_lens),
        query_start_loc_cpu=qsl,
        seq_lens_cpu=seq_lens,
    )


def positions_for(seqs: Sequence[tuple[int, int, Sequence[int]]], device: torch.device | str = "cpu") -> torch.Tensor:
    """Flat positions [T] int64 for the new tokens of each sequence, laid end to end."""
    pos = [p for computed, new, _ in seqs for p in range(computed, computed + new)]
    return torch.tensor(pos, dtype=torch.int64, device=device)


def allocate_kv_cache(model, num_blocks: int, block_size: int, dtype: torch.dtype, device="cpu") -> None:
    """Give every attention layer of ``model`` its own zeroed (key_cache, value_cache)."""
    shape = (num_blocks, block_size, model.num_kv_heads, model.head_dim)
    for attn in model.attention_layers():
        attn.kv_cache = (torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))


def shuffled_blocks(num_blocks: int, seed: int = 0) -> list[int]:
    """A random permutation of block ids (so tests do not pass only for contiguous tables)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randperm(num_blocks, generator=g).tolist()
