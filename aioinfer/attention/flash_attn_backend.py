"""Optional flash-attn (FA2) backend: ``flash_attn_varlen_func`` reading the paged cache through the
block table. Only imported when ``import flash_attn`` works (it does not on the H200 image).

FA2's paged path needs pages of a multiple of 256 tokens and fp16/bf16; for any other cache (our
default block size is 16) attention falls back to the Triton kernels, so selecting this backend is
never wrong, only sometimes no faster. K/V writes use the Triton slot-mapping kernel when triton
imports, else the torch one.

An fp8 KV cache is refused (``supports_fp8_kv = False``; the runner says so before allocating): FA2
reads only fp16/bf16 pages, and flash-attn's fp8 path (FA3's descaled K/V, Hopper only) is not
wired here; "auto" never picks this backend, and the Triton one reads fp8.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from flash_attn import flash_attn_varlen_func  # noqa: F401  (the import is the availability check)

from aioinfer.attention.backend import AttentionBackend
from aioinfer.attention.fp8_kv import is_fp8
from aioinfer.attention.metadata import AttentionMetadata

FA2_PAGE_MULTIPLE = 256


class FlashAttnBackend(AttentionBackend):
    name = "flash_attn"
    supports_cuda_graphs = False  # not verified: flash_attn is absent on the machine we test on
    supports_fp8_kv = False

    def __init__(self) -> None:
        try:
            from aioinfer.attention.triton_backend import TritonAttentionBackend

            self._fallback: AttentionBackend = TritonAttentionBackend()
        except ImportError:
            from aioinfer.attention.torch_backend import TorchAttentionBackend

            self._fallback = TorchAttentionBackend()

    @staticmethod
    def supports(key_cache: torch.Tensor) -> bool:
        return (key_cache.is_cuda and key_cache.dtype in (torch.float16, torch.bfloat16)
                and key_cache.shape[1] % FA2_PAGE_MULTIPLE == 0)

    @staticmethod
    def _refuse_fp8(key_cache: torch.Tensor) -> None:
        if is_fp8(key_cache.dtype):
            raise ValueError("the flash_attn attention backend cannot use an fp8 KV cache (kv_cache_dtype='fp8'): "
                             "use attention_backend 'auto' or 'triton'")

    def write_kv(self, key, value, key_cache, value_cache, slot_mapping, k_scale: float = 1.0,
                 v_scale: float = 1.0) -> None:
        self._refuse_fp8(key_cache)
        self._fallback.write_kv(key, value, key_cache, value_cache, slot_mapping)

    def forward(self, query, key_cache, value_cache, metadata: AttentionMetadata, scale: float,
                k_scale: float = 1.0, v_scale: float = 1.0) -> torch.Tensor:
        # query [T, Hq, D] -> [T, Hq, D]
        self._refuse_fp8(key_cache)
        if not self.supports(key_cache):
            return self._fallback.forward(query, key_cache, value_cache, metadata, scale)
        n = metadata.num_seqs
        seq_lens = metadata.seq_lens[:n]
        cu_seqlens_k = F.pad(torch.cumsum(seq_lens, 0, dtype=torch.int32), (1, 0))
        # FA2 aligns the causal mask bottom-right when seqlen_q < seqlen_k: queries are the last
        # positions of their context, as the interface requires.
        return flash_attn_varlen_func(
            query, key_cache, value_cache,
            cu_seqlens_q=metadata.query_start_loc[: n + 1], cu_seqlens_k=cu_seqlens_k,
            max_seqlen_q=metadata.max_query_len, max_seqlen_k=metadata.max_seq_len,
            softmax_scale=scale, causal=True, block_table=metadata.block_tables[:n],
        )
