"""Owns each request's block table and grows it as the request's computed tokens advance."""

from __future__ import annotations

from collections import Counter
from typing import Optional

from aioinfer.core.block_pool import BlockPool


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.pool = BlockPool(num_blocks)
        self._tables: dict[str, list[int]] = {}

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def capacity_tokens(self) -> int:
        """The most tokens one sequence can ever hold (the whole usable pool)."""
        return self.pool.num_usable_blocks * self.block_size

    def usage(self) -> float:
        return self.pool.usage()

    def block_ids(self, request_id: str) -> list[int]:
        return self._tables.get(request_id, [])

    def allocate_slots(self, request_id: str, num_computed_tokens: int, num_new_tokens: int) -> Optional[list[int]]:
        """Make room for ``num_new_tokens`` after ``num_computed_tokens``; None (and no change) if it can't."""
        table = self._tables.setdefault(request_id, [])
        needed = cdiv(num_computed_tokens + num_new_tokens, self.block_size) - len(table)
        if needed <= 0:
            return []
        if needed > self.pool.num_free_blocks:
            if not table:
                del self._tables[request_id]
            return None
        new_blocks = self.pool.allocate(needed)
        table.extend(new_blocks)
        return new_blocks

    def free(self, request_id: str) -> None:
        table = self._tables.pop(request_id, None)
        if table:
            self.pool.free(table[::-1])

    def check_invariants(self) -> None:
        referenced = Counter(b for table in self._tables.values() for b in table)
        self.pool.check_invariants(referenced)

    def all_free(self) -> bool:
        return not self._tables and self.pool.num_free_blocks == self.pool.num_usable_blocks
