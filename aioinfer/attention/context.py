"""The typed forward context through which attention layers reach the step's metadata.

Models keep vLLM's flat ``forward(input_ids, positions)`` signature; the runner sets the context
around the call. The context is per thread: the GPU thread is the only one that runs models.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator, Optional

from aioinfer.attention.metadata import AttentionMetadata

_local = threading.local()


@contextmanager
def forward_context(metadata: AttentionMetadata) -> Iterator[None]:
    previous = getattr(_local, "metadata", None)
    _local.metadata = metadata
    try:
        yield
    finally:
        _local.metadata = previous


def current_attention_metadata() -> Optional[AttentionMetadata]:
    """The step's metadata, or None outside a forward context (a layer called on its own)."""
    return getattr(_local, "metadata", None)


def get_attention_metadata() -> AttentionMetadata:
    metadata: Optional[AttentionMetadata] = getattr(_local, "metadata", None)
    if metadata is None:
        raise RuntimeError("attention called outside forward_context(); the model runner sets it")
    return metadata
