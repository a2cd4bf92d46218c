"""Giving back the CUDA memory that dropped objects (an engine built earlier in this process, say)
still hold: in reference cycles the collector has not yet freed, or in torch's cache of freed blocks,
which the driver's free-memory figure counts as used."""

from __future__ import annotations

import gc

import torch


def release_dropped_memory() -> None:
    """Collect reference cycles, then empty torch's CUDA cache (where CUDA is in use)."""
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
