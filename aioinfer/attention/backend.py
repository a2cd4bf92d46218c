"""The small interface every attention backend implements (registry.py picks one by name and device).

A backend owns two operations on a paged KV cache laid out as
``[num_blocks, block_size, num_kv_heads, head_dim]`` (one tensor for keys, one for values):
writing the step's new K/V through ``slot_mapping`` and attending the step's queries over each
sequence's context. This module imports no backend: they import it.

A cache may hold the model's dtype or fp8 (``float8_e4m3fn``, fp8_kv.py): each call then carries
the layer's per-tensor ``k_scale`` and ``v_scale`` (Python floats, fixed at load, so that a CUDA graph
may bake them in), which a backend applies to an fp8 cache and ignores for any other. A backend that
cannot hold an fp8 cache says so with ``supports_fp8_kv = False``; the runner refuses the pairing
before it allocates anything (executor/runner_setup.py).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from aioinfer.attention.dense import dense_causal_attention
from aioinfer.attention.metadata import AttentionMetadata


class AttentionBackend(ABC):
    name: str = "abstract"
    supports_fp8_kv: bool = False  # can hold and read a float8_e4m3fn cache

    @abstractmethod
    def write_kv(
        self,
        key: torch.Tensor,  # [T, Hkv, D]
        value: torch.Tensor,  # [T, Hkv, D]
        key_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
        value_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
        slot_mapping: torch.Tensor,  # [T] int64, slot = block_id * block_size + offset
        k_scale: float = 1.0,  # fp8 cache: stored = key / k_scale (ignored for another dtype)
        v_scale: float = 1.0,
    ) -> None:
        """Store the new tokens' K/V in place (quantized when the cache is fp8)."""

    @abstractmethod
    def forward(
        self,
        query: torch.Tensor,  # [T, Hq, D]
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        metadata: AttentionMetadata,
        scale: float,
        k_scale: float = 1.0,  # fp8 cache: key = stored * k_scale (ignored for another dtype)
        v_scale: float = 1.0,
    ) -> torch.Tensor:
        """Causal attention of each sequence's queries (its last ``query_len`` positions) over its
        whole context, read from the cache (the new tokens' K/V must already be written).
        Returns [T, Hq, D] in the query dtype."""

    def forward_no_cache(
        self,
        query: torch.Tensor,  # [T, Hq, D]
        key: torch.Tensor,  # [T, Hkv, D]
        value: torch.Tensor,  # [T, Hkv, D]
        metadata: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        """Prefill-only attention without a cache (profiling / memory-estimate runs): every
        sequence's context is exactly its query tokens. Backends may override with a faster path."""
        out = torch.empty_like(query)
        qsl = metadata.query_start_loc_cpu
        for i in range(metadata.num_seqs):
            s, e = qsl[i], qsl[i + 1]
            out[s:e] = dense_causal_attention(query[s:e], key[s:e], value[s:e], scale)
        return out


class AttentionBackendUnavailable(NotImplementedError):
    """The requested backend cannot run here (its package does not import, or no CUDA device).

    A NotImplementedError (hence a RuntimeError) so that callers written against the earlier
    "not implemented yet" stub keep working."""

