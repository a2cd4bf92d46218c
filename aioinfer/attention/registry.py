"""Choosing an attention backend by name and device: ``get_attention_backend``.

Apart from the interface (backend.py) so that the backends, which import the interface, are not
imported back by it. GPU backends (triton, flash-attn) are imported lazily, inside their branch,
so that CPU-only installs never import triton.
"""

from __future__ import annotations

from typing import Optional

import torch

from aioinfer.attention.backend import AttentionBackend, AttentionBackendUnavailable


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
