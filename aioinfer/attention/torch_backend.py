"""Pure-torch paged attention: the CPU path and the reference the GPU kernels are tested against.

Per sequence it gathers the context K/V through the block table and runs plain causal softmax
attention in float32. A Python loop over sequences is fine for CPU and for tests; it reads only the
host copies of the per-sequence lengths, so it never syncs on a device tensor.

An fp8 cache (fp8_kv.py) is written quantized and read back per gathered sequence as float32
``stored * scale``, so the attention itself is the same float32 math as for any other cache.
"""

from __future__ import annotations

import torch

from aioinfer.attention.backend import AttentionBackend
from aioinfer.attention.dense import dense_causal_attention
from aioinfer.attention.fp8_kv import dequantize, is_fp8, quantize, raw_bytes
from aioinfer.attention.metadata import AttentionMetadata


class TorchAttentionBackend(AttentionBackend):
    name = "torch"
    supports_fp8_kv = True

    def write_kv(self, key, value, key_cache, value_cache, slot_mapping, k_scale: float = 1.0,
                 v_scale: float = 1.0) -> None:
        # Flatten (block, offset) into one slot axis: [num_blocks * block_size, Hkv, D] views.
        num_kv_heads, head_dim = key_cache.shape[-2:]
        if is_fp8(key_cache.dtype):
            key, value = quantize(key, k_scale), quantize(value, v_scale)
        else:
            key, value = key.to(key_cache.dtype), value.to(value_cache.dtype)
        # fp8 through its bytes: torch's CPU index_copy_ has no float8 kernel
        raw_bytes(key_cache).view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, raw_bytes(key))
        raw_bytes(value_cache).view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, raw_bytes(value))

    def forward(self, query, key_cache, value_cache, metadata: AttentionMetadata, scale: float,
                k_scale: float = 1.0, v_scale: float = 1.0) -> torch.Tensor:
        # query [T, Hq, D] -> [T, Hq, D]
        block_size, num_kv_heads, head_dim = key_cache.shape[1:]
        fp8 = is_fp8(key_cache.dtype)
        keys, values = raw_bytes(key_cache), raw_bytes(value_cache)  # fp8 gathered as bytes, on any device
        out = torch.empty_like(query)
        qsl, seq_lens = metadata.query_start_loc_cpu, metadata.seq_lens_cpu
        for i in range(metadata.num_seqs):
            start, end = qsl[i], qsl[i + 1]
            if end == start:
                continue
            seq_len = seq_lens[i]
            num_blocks = -(-seq_len // block_size)
            blocks = metadata.block_tables[i, :num_blocks].to(torch.long)
            k = keys[blocks].reshape(-1, num_kv_heads, head_dim)[:seq_len]  # [S, Hkv, D]
            v = values[blocks].reshape(-1, num_kv_heads, head_dim)[:seq_len]
            if fp8:  # float32 K/V, as dense_causal_attention computes in float32 anyway
                k = dequantize(k.view(key_cache.dtype), k_scale)
                v = dequantize(v.view(value_cache.dtype), v_scale)
            out[start:end] = dense_causal_attention(query[start:end], k, v, scale)
        return out
