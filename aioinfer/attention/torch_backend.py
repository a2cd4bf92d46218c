"""Pure-torch paged attention: the CPU path and the reference the GPU kernels are tested against.

Per sequence it gathers the context K/V through the block table and runs plain causal softmax
attention in float32. A Python loop over sequences is fine for CPU and for tests; it reads only the
host copies of the per-sequence lengths, so it never syncs on a device tensor.
"""

from __future__ import annotations

import torch

from aioinfer.attention.backend import AttentionBackend
from aioinfer.attention.dense import dense_causal_attention
from aioinfer.attention.metadata import AttentionMetadata


class TorchAttentionBackend(AttentionBackend):
    name = "torch"

    def write_kv(self, key, value, key_cache, value_cache, slot_mapping) -> None:
        # Flatten (block, offset) into one slot axis: [num_blocks * block_size, Hkv, D] views.
        num_kv_heads, head_dim = key_cache.shape[-2:]
        key_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, key.to(key_cache.dtype))
        value_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, value.to(value_cache.dtype))

    def forward(self, query, key_cache, value_cache, metadata: AttentionMetadata, scale: float) -> torch.Tensor:
        # query [T, Hq, D] -> [T, Hq, D]
        block_size, num_kv_heads, head_dim = key_cache.shape[1:]
        out = torch.empty_like(query)
        qsl, seq_lens = metadata.query_start_loc_cpu, metadata.seq_lens_cpu
        for i in range(metadata.num_seqs):
            start, end = qsl[i], qsl[i + 1]
            if end == start:
                continue
            seq_len = seq_lens[i]
            num_blocks = -(-seq_len // block_size)
            blocks = metadata.block_tables[i, :num_blocks].to(torch.long)
            k = key_cache[blocks].reshape(-1, num_kv_heads, head_dim)[:seq_len]  # [S, Hkv, D]
            v = value_cache[blocks].reshape(-1, num_kv_heads, head_dim)[:seq_len]
            out[start:end] = dense_causal_attention(query[start:end], k, v, scale)
        return out
