"""KV-cache events: what the prefix cache tells the outside about the blocks it holds.

A KV-aware router (llm-d's precise prefix-cache scorer, NVIDIA Dynamo's KV router) keeps, per engine,
an index of the full blocks that engine has cached, and routes a prompt to the engine holding most of
its leading blocks. The index is fed by events, vLLM's: a block was stored (its key registered in the
prefix cache, its KV reusable), a block was removed (its key dropped: the block was handed out for
new KV), or every block was cleared (``reset_prefix_cache``).

The prefix cache records them here, as they happen, on the GPU thread; the engine takes them once a
step (``take``) and hands them to its publisher (engine/kv_events_publisher.py), whose own thread
makes them records (``records``), merges, encodes and sends them. Recording is on only when an engine
publishes (``kv_events_config``): otherwise the prefix cache holds no recorder and pays one ``is None``
test per block registered or evicted.

The records are aioinfer's, in the prefix cache's terms (its chained keys, ``prefix_cache.chain_hash``);
the wire form (vLLM's ``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared``) is the publisher's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Optional, Union


@dataclass(frozen=True, slots=True)
class StoredBlock:
    """A full block's KV became reusable: its key is in the prefix cache."""

    block_hash: int  # the block's chained key (Python int, signed 64-bit: prefix_cache.chain_hash)
    parent_hash: Optional[int]  # the previous block's key in the chain; None for a prompt's first block
    token_ids: tuple[int, ...]  # the block's tokens (block_size of them)
    cache_salt: Optional[Hashable]  # the request's cache salt, on a chain's first block only (vLLM's extra key)


@dataclass(frozen=True, slots=True)
class RemovedBlock:
    """A block's key left the prefix cache (the block was handed out for new KV, or a colliding key replaced it)."""

    block_hash: int


@dataclass(frozen=True, slots=True)
class CacheCleared:
    """Every key left the prefix cache (``reset_prefix_cache``)."""


KVCacheEvent = Union[StoredBlock, RemovedBlock, CacheCleared]
_CLEARED = CacheCleared()


class KVEventRecorder:
    """The events since the last ``take``, in order. Used on the GPU thread only.

    Kept raw, at the cost of a list append and at most a plain tuple each (0.1 us, where a frozen
    record costs 1 us: a 256-row decode step stores 16 blocks of 16 tokens): a store as
    ``(block_hash, parent_hash, token_ids, extra)``, a removal as its hash, a reset as CacheCleared.
    ``records`` makes them records, on the publisher's thread.
    """

    __slots__ = ("events",)

    def __init__(self) -> None:
        self.events: list = []

    def stored(self, block_hash: int, parent_hash: Optional[int], token_ids: tuple[int, ...],
               extra: Hashable) -> None:
        """``extra``: the chain's extra key as the prefix cache holds it, (model identity, cache salt)
        (kv_cache_manager.py)."""
        self.events.append((block_hash, parent_hash, token_ids, extra))

    def removed(self, block_hash: int) -> None:
        self.events.append(block_hash)

    def cleared(self) -> None:
        self.events.append(_CLEARED)

    def take(self) -> list:
        """The raw events recorded since the last call (for ``records``); when there are any, a list the
        recorder no longer touches (the caller hands it to the publisher's thread)."""
        events = self.events
        if events:
            self.events = []
        return events


def records(raw: list) -> list[KVCacheEvent]:
    """``KVEventRecorder.take``'s raw events as records. A chain's first block keeps its cache salt,
    where the salt entered the key (vLLM's extra key of that block)."""
    out: list[KVCacheEvent] = []
    for item in raw:
        if type(item) is tuple:
            block_hash, parent_hash, token_ids, extra = item
            salt = extra[1] if parent_hash is None and type(extra) is tuple and len(extra) == 2 else None
            out.append(StoredBlock(block_hash, parent_hash, token_ids, salt))
        elif item is _CLEARED:
            out.append(item)
        else:
            out.append(RemovedBlock(item))
    return out
