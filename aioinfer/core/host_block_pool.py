"""Host (pinned-memory) KV blocks for swapped-out requests, handed out as contiguous runs.

Pure Python bookkeeping; the runner owns the memory. A swapped request gets one run of
consecutive host blocks so that the device side moves it with a single copy per direction
(gather into a staging buffer, one transfer, scatter on the way back). Allocation is first fit
over the free extents, which are kept sorted and coalesced on free, so a run is refused only when
no single gap is long enough; the scheduler then preempts by recompute instead.
"""

from __future__ import annotations

import bisect
from typing import Optional


class HostBlockPool:
    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 0:
            raise ValueError(f"num_host_blocks must be >= 0, got {num_blocks}")
        self.num_blocks = num_blocks
        # Free extents as parallel sorted lists: _starts[i] .. _starts[i] + _lengths[i] (blocks).
        self._starts: list[int] = [0] if num_blocks else []
        self._lengths: list[int] = [num_blocks] if num_blocks else []
        self._runs: dict[int, int] = {}  # allocated run start -> length

    @property
    def num_free_blocks(self) -> int:
        return sum(self._lengths)

    @property
    def largest_free_run(self) -> int:
        return max(self._lengths, default=0)

    def allocate(self, count: int) -> Optional[int]:
        """Start of a free run of ``count`` consecutive blocks (first fit), or None when no gap fits."""
        if count < 1:
            raise ValueError(f"a host run needs at least one block, got {count}")
        for i, length in enumerate(self._lengths):
            if length >= count:
                start = self._starts[i]
                if length == count:
                    del self._starts[i], self._lengths[i]
                else:
                    self._starts[i] += count
                    self._lengths[i] -= count
                self._runs[start] = count
                return start
        return None

    def free(self, start: int) -> None:
        """Return the run that ``allocate`` handed out at ``start``, merging it with free neighbours."""
        count = self._runs.pop(start)
        i = bisect.bisect_left(self._starts, start)
        merge_left = i > 0 and self._starts[i - 1] + self._lengths[i - 1] == start
        merge_right = i < len(self._starts) and start + count == self._starts[i]
        if merge_left and merge_right:
            self._lengths[i - 1] += count + self._lengths[i]
            del self._starts[i], self._lengths[i]
        elif merge_left:
            self._lengths[i - 1] += count
        elif merge_right:
            self._starts[i] = start
            self._lengths[i] += count
        else:
            self._starts.insert(i, start)
            self._lengths.insert(i, count)

    def run_length(self, start: int) -> int:
        return self._runs[start]

    def check_invariants(self, held: dict[int, int]) -> None:
        """``held`` maps run start -> length for every swapped request; raises AssertionError on drift."""
        assert held == self._runs, f"host runs held {held} != allocated {self._runs}"
        extents = sorted([(s, n, "free") for s, n in zip(self._starts, self._lengths)]
                         + [(s, n, "run") for s, n in self._runs.items()])
        position = 0
        previous_free = False
        for start, length, kind in extents:
            assert length > 0 and start == position, f"host extents overlap or leave a hole at {position}"
            is_free = kind == "free"
            assert not (is_free and previous_free), f"free host extents not coalesced at {start}"
            previous_free = is_free
            position = start + length
        assert position == self.num_blocks, f"host extents cover {position} of {self.num_blocks} blocks"

    def all_free(self) -> bool:
        return not self._runs
