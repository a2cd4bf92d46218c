"""Triton paged attention backend: slot-mapped K/V writes, a split-K GQA decode kernel, and a
ragged chunked-prefill kernel that also serves mixed decode + prefill batches.

Importing this module imports triton; ``get_attention_backend`` imports it only when asked for
"triton" (or "auto" on CUDA). Nothing here syncs with the host: kernel choice and grids come from
the metadata's Python ints.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Optional

import torch

from aioinfer.attention.backend import AttentionBackend
from aioinfer.attention.metadata import AttentionMetadata
from aioinfer.attention.triton_ops.decode import choose_num_splits, paged_decode
from aioinfer.attention.triton_ops.kv_write import write_kv
from aioinfer.attention.triton_ops.prefill import paged_prefill, prefill_programs_per_kv_head


class TritonAttentionBackend(AttentionBackend):
    """Paged attention on Triton kernels (fp16, bf16, fp32; head_dim a power of two 16..256), over a
    cache of the query's dtype or of fp8 (float8_e4m3fn, with the layer's K/V scales).

    Decode steps (``max_query_len == 1``) use the split-K decode kernel; any other step uses the
    prefill kernel, which handles chunked prefill and decode rows side by side.

    For CUDA graphs, fix the split count of the decode launch while capturing and replaying a
    bucket: ``with backend.decode_splits(n): ...`` (``n`` from :meth:`num_splits_for` with the
    bucket's batch size and the engine's max context). Without it the split count follows the
    step's ``max_seq_len``, which changes the launch from step to step.
    """

    name = "triton"
    supports_cuda_graphs = True  # reads every per-sequence value from device tensors
    supports_fp8_kv = True  # float8_e4m3fn caches: quantized on write, converted per tile on read

    def __init__(self, decode_num_splits: Optional[int] = None) -> None:
        self.decode_num_splits = decode_num_splits  # None: chosen per step from max_seq_len

    @contextmanager
    def decode_splits(self, num_splits: Optional[int]) -> Iterator[None]:
        previous = self.decode_num_splits
        self.decode_num_splits = num_splits
        try:
            yield
        finally:
            self.decode_num_splits = previous

    @staticmethod
    def num_splits_for(num_seqs: int, num_kv_heads: int, max_context: int, device: torch.device) -> int:
        """The split count the heuristic picks for a batch of ``num_seqs`` with contexts <= max_context."""
        return choose_num_splits(num_seqs, num_kv_heads, max_context, torch.device(device))

    @staticmethod
    def prefill_splits_for(num_tokens: int, num_heads: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                           max_context: int, device: torch.device) -> int:
        """The context-split count for a step of up to ``num_tokens`` tokens in one sequence over
        contexts <= max_context (a CUDA-graph bucket: the grid is fixed, the lengths are not)."""
        programs = prefill_programs_per_kv_head(num_tokens, 1, num_heads, num_kv_heads, head_dim, dtype)
        return choose_num_splits(programs, num_kv_heads, max_context, torch.device(device))

    def write_kv(self, key, value, key_cache, value_cache, slot_mapping, k_scale: float = 1.0,
                 v_scale: float = 1.0) -> None:
        write_kv(key, value, key_cache, value_cache, slot_mapping, k_scale, v_scale)

    def forward(self, query, key_cache, value_cache, metadata: AttentionMetadata, scale: float,
                k_scale: float = 1.0, v_scale: float = 1.0) -> torch.Tensor:
        # query [T, Hq, D] -> [T, Hq, D]
        if metadata.max_query_len == 1 and metadata.num_tokens == metadata.num_seqs:
            return paged_decode(
                query, key_cache, value_cache, metadata.block_tables, metadata.seq_lens, scale,
                max_seq_len=metadata.max_seq_len,
                num_splits=metadata.decode_num_splits if metadata.decode_num_splits is not None
                else self.decode_num_splits, k_scale=k_scale, v_scale=v_scale,
            )
        return paged_prefill(
            query, key_cache, value_cache, metadata.block_tables, metadata.seq_lens,
            metadata.query_start_loc, metadata.num_seqs, scale, max_seq_len=metadata.max_seq_len,
            num_splits=metadata.prefill_num_splits, k_scale=k_scale, v_scale=v_scale,
        )

    def forward_no_cache(self, query, key, value, metadata: AttentionMetadata, scale: float) -> torch.Tensor:
        # Every sequence's context is its own query tokens: view K/V as a cache of one-token blocks
        # whose block table row i is qsl[i] + 0, 1, 2, ... (built on the device, no sync).
        key = key.contiguous()
        value = value.contiguous()
        num_seqs = metadata.num_seqs
        qsl = metadata.query_start_loc
        starts = qsl[:num_seqs].to(torch.int32)
        block_tables = (starts[:, None] + torch.arange(max(metadata.max_query_len, 1), dtype=torch.int32,
                                                       device=query.device)[None, :])
        block_tables = block_tables.clamp_(max=max(key.shape[0] - 1, 0)).to(torch.int32)
        seq_lens = (qsl[1 : num_seqs + 1] - qsl[:num_seqs]).to(torch.int32)
        return paged_prefill(
            query, key.unsqueeze(1), value.unsqueeze(1), block_tables, seq_lens, qsl, num_seqs, scale,
        )
