"""The prefix cache: full KV blocks indexed by a chained hash of their tokens, verified on every hit.

A block's key is ``hash((parent key, its token ids))``; the first block's is
``hash((extra, its token ids))``, where ``extra`` is (model identity, the request's cache salt), so
equal prompts of two tenants with different salts never meet. The hash only finds a candidate:
a hit also requires equal token ids, an equal extra, and that the candidate's parent *is* the
entry matched for the previous block (object identity, not an equal hash). By induction over the
blocks a hit therefore holds exactly the KV of the same token prefix, whatever the hash collides
with (Python's tuple hash is not collision resistant, and tenants choose their prompts).

Entries die when their block is handed out again (the pool's free list is the eviction order);
the children of a dead entry can no longer be matched, since no live parent leads to them.

An entry is a plain tuple, ``(block_id, block_hash, token_ids, parent, extra)`` (read through the
index names below), and an entry is live while the cache still maps its block to it. Not an object
of a class: the garbage collector tracks, and every full collection traverses, each instance of a
class, but it stops tracking a tuple whose items need no tracking (ints, tuples of ints, strings,
None, and parent entries it has stopped tracking). A cache holds an entry for every block it has
ever seen until the block is handed out again, up to the pool's size (600k+ blocks for a 0.5b model
on an H200), and as objects they were the part of the tracked heap that grows with the cache: with
the start-up heap frozen, as the server does, each full collection of the H200 benchmark process
still took about 40 ms, the objects made since start-up, of which the cache entries are the ones
that accumulate (2026-12-04).

With KV-cache events on (``kv_events_config``), each key registered, each key dropped and a reset are
recorded for the engine's publisher (kv_events.py); off, ``events`` is None and costs one test per
registration or eviction of a cached block.
"""

from __future__ import annotations

from typing import Callable, Hashable, Optional, Sequence

from aioinfer.core.kv_events import KVEventRecorder

CachedBlock = tuple  # (block_id, block_hash, token_ids, parent, extra); identity matters: children point at their parent
BLOCK_ID, BLOCK_HASH, TOKEN_IDS, PARENT, EXTRA = range(5)

# Stands in a request's chain where a block could not be cached (its parent died, or its key is
# held by an entry still in use): nothing after it is cached for that request. Never live.
BROKEN: CachedBlock = (-1, 0, (), None, None)


def chain_hash(parent: Optional[int], token_ids: tuple[int, ...], extra: Hashable) -> int:
    return hash((extra, token_ids)) if parent is None else hash((parent, token_ids))


class PrefixCache:
    def __init__(self, events: Optional[KVEventRecorder] = None) -> None:
        self._by_hash: dict[int, CachedBlock] = {}
        self._by_block: dict[int, CachedBlock] = {}
        self.events = events  # records stores, removals and resets for the KV-event publisher; None: off

    def __len__(self) -> int:
        return len(self._by_block)

    def is_cached(self, block_id: int) -> bool:
        return block_id in self._by_block

    def is_live(self, entry: CachedBlock) -> bool:
        """Whether ``entry`` still stands for its block's KV (not evicted, not BROKEN)."""
        return self._by_block.get(entry[BLOCK_ID]) is entry

    def match(self, hashes: Sequence[int], tokens_of: Callable[[int], tuple[int, ...]], extra: Hashable,
              max_blocks: int) -> list[CachedBlock]:
        """The longest run of leading blocks whose KV is cached (at most ``max_blocks``)."""
        matched: list[CachedBlock] = []
        parent = None
        for i in range(min(max_blocks, len(hashes))):
            entry = self._by_hash.get(hashes[i])
            if (entry is None or entry[PARENT] is not parent or entry[EXTRA] != extra
                    or entry[TOKEN_IDS] != tokens_of(i)):
                break
            matched.append(entry)
            parent = entry
        return matched

    def register(self, block_id: int, block_hash: int, token_ids: tuple[int, ...], parent: Optional[CachedBlock],
                 extra: Hashable, in_use: Callable[[int], bool]) -> CachedBlock:
        """Cache a freshly computed full block; returns the entry that now stands for its KV.

        That is the new entry, or an equal entry cached earlier (then ``block_id`` stays uncached:
        two requests computed the same block at once), or BROKEN when the block cannot be cached.
        """
        if parent is not None and not self.is_live(parent):
            return BROKEN  # its parent died
        existing = self._by_hash.get(block_hash)
        if existing is not None:
            if existing[PARENT] is parent and existing[TOKEN_IDS] == token_ids and existing[EXTRA] == extra:
                return existing
            # A hash collision, or an entry whose parent died (unreachable, yet holding the key).
            if in_use(existing[BLOCK_ID]):
                return BROKEN
            self.evict(existing[BLOCK_ID])
        assert block_id not in self._by_block, f"block {block_id} is cached twice"
        entry = (block_id, block_hash, token_ids, parent, extra)
        self._by_hash[block_hash] = entry
        self._by_block[block_id] = entry
        if self.events is not None:
            self.events.stored(block_hash, None if parent is None else parent[BLOCK_HASH], token_ids, extra)
        return entry

    def entry(self, block_id: int) -> Optional[CachedBlock]:
        return self._by_block.get(block_id)

    def evict(self, block_id: int) -> None:
        """Forget the block's KV (it is being handed out for new KV); a no-op for uncached blocks."""
        entry = self._by_block.pop(block_id, None)
        if entry is not None:
            del self._by_hash[entry[BLOCK_HASH]]
            if self.events is not None:
                self.events.removed(entry[BLOCK_HASH])

    def clear(self) -> None:
        """Forget every block's KV (``reset_prefix_cache``; the caller checks that no block is in use).
        Entries still named by a request's chain stop being live, so nothing can build on them."""
        self._by_hash.clear()
        self._by_block.clear()
        if self.events is not None:
            self.events.cleared()

    def check_invariants(self) -> None:
        assert len(self._by_hash) == len(self._by_block), "cache index and block map differ in size"
        for block_hash, entry in self._by_hash.items():
            assert type(entry) is tuple, "an entry must be a plain tuple (see the module docstring)"
            assert entry[BLOCK_HASH] == block_hash, f"stale cache entry for block {entry[BLOCK_ID]}"
            assert self._by_block.get(entry[BLOCK_ID]) is entry, f"block {entry[BLOCK_ID]} maps to another entry"
