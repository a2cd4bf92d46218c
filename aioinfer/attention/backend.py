"""The small interface every attention backend implements, and the factory that picks one.

A backend owns two operations on a paged KV cache laid out as
``[num_blocks, block_size, num_kv_heads, head_dim]`` (one tensor for keys, one for values):
writing the step's new K/V through ``slot_mapping`` and attending the step's queries over each
sequence's context. GPU backends (triton, flash-attn) are imported lazily so that CPU-only installs
never import triton.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Optional

import torch

from aioinfer.attention.metadata import AttentionMetadata


class AttentionBackend(ABC):
    name: str = "abstract"

    @abstractmethod
    def write_kv(
        self,
        key: torch.Tensor,  # [T, Hkv, D]
        value: torch.Tensor,  # [T, Hkv, D]
        key_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
        value_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
        slot_mapping: torch.Tensor,  # [T] int64, slot = block_id * block_size + offset
    ) -> None:
        """Store the new tokens' K/V in place."""

    @abstractmethod
    def forward(
        self,
        query: torch.Tensor,  # [T, Hq, D]
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        metadata: AttentionMetadata,
        scale: float,
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
        from aioinfer.attention.torch_backend import dense_causal_attention

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


def _triton_importable() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def get_attention_backend(name: str = "torch", device: Optional[torch.device] = None) -> AttentionBackend:
    """Return the backend called ``name``: "torch", "triton", "flash_attn" or "auto".

    "auto" is "triton" when ``device`` is a CUDA device and triton imports, else "torch". "triton"
    and "flash_attn" raise :class:`AttentionBackendUnavailable` when their package does not import;
    both are imported only here, inside their branch, never at module load.
    """
    if name not in ("auto", "torch", "triton", "flash_attn"):
        raise ValueError(f"unknown attention backend {name!r}; expected one of: auto, torch, triton, flash_attn")
    dev = torch.device(device) if device is not None else None
    if name == "auto":
        name = "triton" if dev is not None and dev.type == "cuda" and _triton_importable() else "torch"
    if name == "torch":
        from aioinfer.attention.torch_backend import TorchAttentionBackend

        return TorchAttentionBackend()
    if name == "triton":
        if not _triton_importable():
            raise AttentionBackendUnavailable("attention backend 'triton' needs the triton package")
        if dev is not None and dev.type != "cuda":
            import os

            if os.environ.get("TRITON_INTERPRET", "0") != "1":
                raise AttentionBackendUnavailable(
                    f"attention backend 'triton' needs a CUDA device, got {dev} (or TRITON_INTERPRET=1 for tests)")
        from aioinfer.attention.triton_backend import TritonAttentionBackend

        return TritonAttentionBackend()
    try:
        import flash_attn  # noqa: F401
    except ImportError as e:
        raise AttentionBackendUnavailable(f"attention backend 'flash_attn' needs the flash_attn package ({e})") from e
    from aioinfer.attention.flash_attn_backend import FlashAttnBackend

    return FlashAttnBackend()
