"""The pool of KV blocks: ids, reference counts and a free list in least-recently-freed order.

Pure Python. Block 0 is reserved as the null block: padded block-table entries and padded
tokens (CUDA-graph batches) point at it, so it is never handed out.

A free block may still hold the KV of a cached prefix (see prefix_cache.py): it stays in the
free list, where ``touch`` can revive it, until ``allocate`` hands it out again. The free list's
order is therefore also the prefix cache's eviction order: least recently freed first.
"""

from __future__ import annotations

from collections import OrderedDict

NULL_BLOCK_ID = 0


class NoFreeBlocksError(RuntimeError):
    """Raised when more blocks are asked for than are free (callers check first)."""


class BlockPool:
    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 2:
            raise ValueError(f"num_kv_blocks must be >= 2 (one is the reserved null block), got {num_blocks}")
        self.num_blocks = num_blocks
        self.ref_counts = [0] * num_blocks
        # Insertion order is eviction order: the prefix cache revives blocks from the middle,
        # which a deque cannot do cheaply.
        self._free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(1, num_blocks))
        self.ref_counts[NULL_BLOCK_ID] = 1  # pinned forever

    @property
    def num_usable_blocks(self) -> int:
        return self.num_blocks - 1

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def usage(self) -> float:
        """Fraction of usable blocks in use, in [0, 1]."""
        return 1.0 - self.num_free_blocks / self.num_usable_blocks

    def allocate(self, count: int) -> list[int]:
        if count > len(self._free):
            raise NoFreeBlocksError(f"asked for {count} KV blocks, {len(self._free)} free")
        blocks = []
        for _ in range(count):
            block_id, _ = self._free.popitem(last=False)
            self.ref_counts[block_id] = 1
            blocks.append(block_id)
        return blocks

    def touch(self, block_ids: list[int]) -> int:
        """Take one more reference on each block (prefix-cache hits); returns how many left the free list."""
        revived = 0
        for block_id in block_ids:
            if self.ref_counts[block_id] == 0:
                del self._free[block_id]
                revived += 1
            self.ref_counts[block_id] += 1
        return revived

    def is_free(self, block_id: int) -> bool:
        return self.ref_counts[block_id] == 0

    def free(self, block_ids: list[int]) -> None:
        """Drop one reference from each block; blocks reaching zero join the free list.

        Callers pass a sequence's blocks tail first, so that the tail is reused (evicted) first.
        """
        for block_id in block_ids:
            count = self.ref_counts[block_id] - 1
            assert count >= 0 and block_id != NULL_BLOCK_ID, f"double free of block {block_id}"
            self.ref_counts[block_id] = count
            if count == 0:
                self._free[block_id] = None

    def check_invariants(self, referenced: dict[int, int]) -> None:
        """``referenced`` maps block id -> how many block tables hold it; raises AssertionError on drift."""
        for block_id in range(1, self.num_blocks):
            expected = referenced.get(block_id, 0)
            assert self.ref_counts[block_id] == expected, (
                f"block {block_id}: ref count {self.ref_counts[block_id]}, held by {expected} tables")
            assert (block_id in self._free) == (expected == 0), f"block {block_id}: free-list membership wrong"
        assert self.ref_counts[NULL_BLOCK_ID] == 1 and NULL_BLOCK_ID not in self._free
