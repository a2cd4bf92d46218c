"""Owns each request's block table: prefix-cache hits, reservations at admission, lazy growth.

Reservation: a request is admitted only if the blocks its uncached known tokens need fit beside
every other admitted request's outstanding reservation. The blocks materialise lazily, as chunks
are granted; a request may always take its own reserved blocks, and anything beyond them (decode
growth) only from blocks nobody has reserved. So an admitted prefill never stalls halfway for lack
of blocks that were there when it was admitted; decode growth is what preempts.

Free blocks include cached ones nobody references (they are evicted when handed out), so
``num_free_blocks`` is what can be allocated, and "all free" means "nothing referenced".
"""

from __future__ import annotations

from collections import Counter
from typing import Optional

from aioinfer.core.block_pool import BlockPool
from aioinfer.core.kv_events import KVEventRecorder
from aioinfer.core.prefix_cache import BLOCK_ID, BROKEN, CachedBlock, PrefixCache, chain_hash
from aioinfer.request import Request


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 model_identity: str = "", kv_events: bool = False) -> None:
        self.block_size = block_size
        self.pool = BlockPool(num_blocks)
        # KV-cache events (kv_events.py): the prefix cache's stores and removals, for the engine to
        # publish; None (nothing recorded) unless asked for, and without a prefix cache there are none
        self.events = KVEventRecorder() if kv_events and enable_prefix_caching else None
        self.prefix_cache = PrefixCache(self.events) if enable_prefix_caching else None
        self.model_identity = model_identity  # part of every chain's first key
        self._tables: dict[str, list[int]] = {}
        # Per table, the cache entries that stand for its leading full blocks (the request's own
        # block's entry, an equal entry computed by another request, or BROKEN); shorter than the
        # table while the tail is partial, uncomputed or not yet registered.
        self._chains: dict[str, list[CachedBlock]] = {}
        self._reserved: dict[str, int] = {}  # request id -> table length (blocks) promised at admission
        self._num_reserved = 0  # outstanding (promised, not yet allocated) blocks of all requests

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def num_reserved_blocks(self) -> int:
        return self._num_reserved

    @property
    def capacity_tokens(self) -> int:
        """The most tokens one sequence can ever hold (the whole usable pool)."""
        return self.pool.num_usable_blocks * self.block_size

    def usage(self) -> float:
        return self.pool.usage()

    def block_ids(self, request_id: str) -> list[int]:
        return self._tables.get(request_id, [])

    def holds(self, request_id: str) -> bool:
        """Whether the request has a table or a reservation (admitted and not freed since)."""
        return request_id in self._tables or request_id in self._reserved

    # ------------------------------------------------------------------ admission

    def admit(self, request: Request, match: bool = True) -> Optional[int]:
        """Reserve blocks for the request's known tokens, reusing cached leading blocks (none with
        ``match=False``: a request that needs every prompt position computed).

        Returns the number of tokens found in the cache (its computed tokens from now on), or None
        (and no change) when its uncached blocks do not fit beside the other reservations. At least
        the last known token is always left to compute: the block holding it is never taken from
        the cache, because a shared block is never written and the step must produce its logits.
        """
        hits = self.match_prefix(request) if match else []
        target = cdiv(request.num_tokens, self.block_size)
        hit_ids = [entry[BLOCK_ID] for entry in hits]
        revived = sum(1 for block_id in hit_ids if self.pool.is_free(block_id))
        if target - len(hits) + self._num_reserved > self.pool.num_free_blocks - revived:
            return None
        self.pool.touch(hit_ids)
        self._tables[request.request_id] = hit_ids
        self._chains[request.request_id] = hits
        self._reserve(request.request_id, target)
        return len(hits) * self.block_size

    def admit_swapped(self, request: Request, num_blocks: int) -> Optional[list[int]]:
        """Reserve blocks for a swapped request's known tokens and allocate ``num_blocks`` of them now
        (fresh, private: the targets of its swap-in). None (and no change) when they do not fit."""
        target = max(cdiv(request.num_tokens, self.block_size), num_blocks)
        if target + self._num_reserved > self.pool.num_free_blocks:
            return None
        self._tables[request.request_id] = []
        self._chains[request.request_id] = []
        self._reserve(request.request_id, target)
        return self.allocate_slots(request.request_id, 0, num_blocks * self.block_size)

    def _reserve(self, request_id: str, target_blocks: int) -> None:
        self._reserved[request_id] = target_blocks
        self._num_reserved += self.outstanding_blocks(request_id)

    def outstanding_blocks(self, request_id: str) -> int:
        target = self._reserved.get(request_id)
        return 0 if target is None else max(0, target - len(self._tables.get(request_id, ())))

    # ------------------------------------------------------------------ growth

    def allocate_slots(self, request_id: str, num_computed_tokens: int, num_new_tokens: int) -> Optional[list[int]]:
        """Make room for ``num_new_tokens`` after ``num_computed_tokens``; None (and no change) if it can't.

        The request's own outstanding reservation is always available to it; blocks beyond it
        come only from those no other request has reserved.
        """
        table = self._tables.setdefault(request_id, [])
        needed = cdiv(num_computed_tokens + num_new_tokens, self.block_size) - len(table)
        if needed <= 0:
            return []
        own = self.outstanding_blocks(request_id)
        if needed > self.pool.num_free_blocks - (self._num_reserved - own):
            if not table and request_id not in self._reserved:
                del self._tables[request_id]
            return None
        new_blocks = self.pool.allocate(needed)
        if self.prefix_cache is not None:
            for block_id in new_blocks:
                self.prefix_cache.evict(block_id)
        table.extend(new_blocks)
        self._num_reserved -= own - self.outstanding_blocks(request_id)
        return new_blocks

    def trim(self, request_id: str, num_tokens: int) -> None:
        """Free the blocks past the first ``num_tokens`` tokens (rejected drafts' room), tail first.

        They were allocated beyond the request's reservation and never registered in the prefix cache
        (only known tokens are), so they simply go back to the free list."""
        table = self._tables.get(request_id)
        keep = cdiv(num_tokens, self.block_size)
        if not table or len(table) <= keep:
            return
        outstanding = self.outstanding_blocks(request_id)
        # A new list, not a shortened one: the runner mirrors each table by the list's identity and
        # length, and a table that only ever grows in place is what that mirror relies on.
        self._tables[request_id] = table[:keep]
        self.pool.free(table[keep:][::-1])
        self._num_reserved += self.outstanding_blocks(request_id) - outstanding

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Register the request's full blocks among its first ``num_tokens`` tokens (computed, or being
        computed by a launched step, and known on the host) in the prefix cache."""
        if self.prefix_cache is None:
            return
        # Every grant calls this, and a decode step fills a block only every block_size tokens: the
        # common "nothing new to register" answer comes first, before any other lookup.
        request_id = request.request_id
        chain = self._chains.get(request_id)
        if chain is not None and len(chain) >= num_tokens // self.block_size:
            return
        table = self._tables.get(request_id)
        if not table:
            return
        if chain is None:
            chain = self._chains[request_id] = []
        num_full = min(num_tokens, request.num_tokens) // self.block_size
        if len(chain) >= num_full:
            return
        hashes = self._hashes(request, num_full)
        extra = (self.model_identity, request.cache_salt)
        while len(chain) < num_full:
            i = len(chain)
            parent = chain[-1] if chain else None
            if parent is BROKEN:
                chain.append(BROKEN)
                continue
            chain.append(self.prefix_cache.register(
                table[i], hashes[i], self._block_tokens(request, i), parent, extra,
                in_use=lambda block_id: not self.pool.is_free(block_id)))

    def free(self, request: Request) -> None:
        """Drop the request's blocks (tail first, so the tail is evicted first) and its reservation.

        Its computed full blocks are cached first: a preempted or finished request's KV stays
        reusable until the blocks are handed out again.
        """
        request_id = request.request_id
        self.cache_blocks(request, request.num_computed_tokens)
        self._num_reserved -= self.outstanding_blocks(request_id)
        self._reserved.pop(request_id, None)
        self._chains.pop(request_id, None)
        table = self._tables.pop(request_id, None)
        if table:
            self.pool.free(table[::-1])

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block (vLLM's ``reset_prefix_cache``); False, and no change, while any
        block is in use (a request holds a table), as vLLM's refuses then."""
        if self.prefix_cache is None:
            return True
        if self.pool.num_free_blocks != self.pool.num_usable_blocks:
            return False
        self.prefix_cache.clear()
        return True

    # ------------------------------------------------------------------ prefix lookup

    def match_prefix(self, request: Request) -> list[CachedBlock]:
        if self.prefix_cache is None:
            return []
        max_blocks = (request.num_tokens - 1) // self.block_size  # never the block of the last token
        if max_blocks <= 0:
            return []
        hashes = self._hashes(request, max_blocks)
        return self.prefix_cache.match(hashes, lambda i: self._block_tokens(request, i),
                                       (self.model_identity, request.cache_salt), max_blocks)

    def _hashes(self, request: Request, num_blocks: int) -> list[int]:
        """The request's chained block keys, extended (once, kept on the request) to ``num_blocks``."""
        hashes = request.block_hashes
        extra = (self.model_identity, request.cache_salt)
        while len(hashes) < num_blocks:
            i = len(hashes)
            hashes.append(chain_hash(hashes[-1] if i else None, self._block_tokens(request, i), extra))
        return hashes

    def _block_tokens(self, request: Request, index: int) -> tuple[int, ...]:
        return tuple(request.token_ids_slice(index * self.block_size, (index + 1) * self.block_size))

    # ------------------------------------------------------------------ checks

    def check_invariants(self) -> None:
        """Ref counts, free list, cache index and reservations agree; raises AssertionError on drift."""
        referenced = Counter(b for table in self._tables.values() for b in table)
        self.pool.check_invariants(referenced)
        outstanding = 0
        for request_id, target in self._reserved.items():
            assert request_id in self._tables, f"{request_id} holds a reservation but no table"
            outstanding += max(0, target - len(self._tables[request_id]))
        assert outstanding == self._num_reserved, f"reservations sum to {outstanding}, counted {self._num_reserved}"
        assert self._num_reserved <= self.pool.num_free_blocks, (
            f"{self._num_reserved} blocks reserved but only {self.pool.num_free_blocks} free")
        if self.prefix_cache is None:
            assert not any(self._chains.values())
            return
        self.prefix_cache.check_invariants()
        for request_id, table in self._tables.items():
            chain = self._chains.get(request_id, [])
            assert len(chain) <= len(table), f"{request_id}: cache chain longer than its table"
            for i, entry in enumerate(chain):
                if self.prefix_cache.is_live(entry) and entry[BLOCK_ID] == table[i]:
                    assert self.prefix_cache.entry(table[i]) is entry
            # Blocks past the chain are being written: they must be private and uncached.
            for block_id in table[len(chain):]:
                assert not self.prefix_cache.is_cached(block_id), (
                    f"{request_id}: block {block_id} is cached but still being written")
                assert self.pool.ref_counts[block_id] == 1, f"{request_id}: block {block_id} is shared while written"

    def num_chain_blocks(self, request_id: str) -> int:
        """Leading blocks of the table known to the cache (their KV is complete and immutable)."""
        return len(self._chains.get(request_id, ()))

    def all_free(self) -> bool:
        """Nothing referenced and nothing reserved (cached blocks with no reference count as free)."""
        return (not self._tables and not self._reserved
                and self.pool.num_free_blocks == self.pool.num_usable_blocks)
