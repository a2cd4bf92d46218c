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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Hashable, Optional, Sequence


@dataclass(slots=True, eq=False)
class CachedBlock:
    """One cached full block (identity matters: children point at their parent entry)."""

    block_id: int
    block_hash: int  # the chained key
    token_ids: tuple[int, ...]  # block_size tokens, checked on hit
    parent: Optional["CachedBlock"]  # the entry of the previous block; None for a sequence's first block
    extra: Hashable  # (model identity, cache salt), checked on hit
    live: bool = True  # False once the block was evicted (handed out for other KV)


# Stands in a request's chain where a block could not be cached (its parent died, or its key is
# held by an entry still in use): nothing after it is cached for that request.
BROKEN = CachedBlock(block_id=-1, block_hash=0, token_ids=(), parent=None, extra=None, live=False)


def chain_hash(parent: Optional[int], token_ids: tuple[int, ...], extra: Hashable) -> int:
    return hash((extra, token_ids)) if parent is None else hash((parent, token_ids))


class PrefixCache:
    def __init__(self) -> None:
        self._by_hash: dict[int, CachedBlock] = {}
        self._by_block: dict[int, CachedBlock] = {}

    def __len__(self) -> int:
        return len(self._by_block)

    def is_cached(self, block_id: int) -> bool:
        return block_id in self._by_block

    def match(self, hashes: Sequence[int], tokens_of: Callable[[int], tuple[int, ...]], extra: Hashable,
              max_blocks: int) -> list[CachedBlock]:
        """The longest run of leading blocks whose KV is cached (at most ``max_blocks``)."""
        matched: list[CachedBlock] = []
        parent = None
        for i in range(min(max_blocks, len(hashes))):
            entry = self._by_hash.get(hashes[i])
            if (entry is None or entry.parent is not parent or entry.extra != extra
                    or entry.token_ids != tokens_of(i)):
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
        if parent is not None and not parent.live:
            return BROKEN
        existing = self._by_hash.get(block_hash)
        if existing is not None:
            if existing.parent is parent and existing.token_ids == token_ids and existing.extra == extra:
                return existing
            # A hash collision, or an entry whose parent died (unreachable, yet holding the key).
            if in_use(existing.block_id):
                return BROKEN
            self.evict(existing.block_id)
        assert block_id not in self._by_block, f"block {block_id} is cached twice"
        entry = CachedBlock(block_id, block_hash, token_ids, parent, extra)
        self._by_hash[block_hash] = entry
        self._by_block[block_id] = entry
        return entry

    def entry(self, block_id: int) -> Optional[CachedBlock]:
        return self._by_block.get(block_id)

    def evict(self, block_id: int) -> None:
        """Forget the block's KV (it is being handed out for new KV); a no-op for uncached blocks."""
        entry = self._by_block.pop(block_id, None)
        if entry is not None:
            del self._by_hash[entry.block_hash]
            entry.live = False

    def check_invariants(self) -> None:
        assert len(self._by_hash) == len(self._by_block), "cache index and block map differ in size"
        for block_hash, entry in self._by_hash.items():
            assert entry.live and entry.block_hash == block_hash, f"stale cache entry for block {entry.block_id}"
            assert self._by_block.get(entry.block_id) is entry, f"block {entry.block_id} maps to another entry"
