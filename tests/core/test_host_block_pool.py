"""The host block pool: contiguous runs, first fit, coalescing on free, refusal only when no gap fits."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aioinfer.core.host_block_pool import HostBlockPool


def test_first_fit_and_coalescing():
    pool = HostBlockPool(10)
    a, b, c = pool.allocate(3), pool.allocate(3), pool.allocate(3)
    assert (a, b, c) == (0, 3, 6) and pool.num_free_blocks == 1
    assert pool.allocate(2) is None  # one free block left
    pool.free(b)
    assert pool.allocate(4) is None and pool.largest_free_run == 3  # 3 free in the middle + 1 at the end
    pool.free(a)  # merges with the gap on its right: 0..5 free
    assert pool.largest_free_run == 6
    assert pool.allocate(5) == 0  # first fit: the lowest gap that holds it
    pool.free(c)  # merges 6..8 with the last block and the free block at 5
    assert pool.largest_free_run == 5 and pool.allocate(5) == 5
    pool.check_invariants({0: 5, 5: 5})
    pool.free(0)
    pool.free(5)
    assert pool.all_free() and pool.largest_free_run == 10
    pool.check_invariants({})


def test_empty_pool_refuses_everything():
    pool = HostBlockPool(0)
    assert pool.allocate(1) is None and pool.num_free_blocks == 0
    pool.check_invariants({})
    with pytest.raises(ValueError):
        HostBlockPool(-1)
    with pytest.raises(ValueError):
        HostBlockPool(4).allocate(0)


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 10_000), size=st.integers(1, 64))
def test_random_allocations_match_a_bitmap_model(seed, size):
    rng = random.Random(seed)
    pool = HostBlockPool(size)
    used = [False] * size
    runs: dict[int, int] = {}
    for _ in range(200):
        if runs and rng.random() < 0.45:
            start = rng.choice(sorted(runs))
            pool.free(start)
            for i in range(start, start + runs.pop(start)):
                used[i] = False
        else:
            count = rng.randint(1, max(1, size // 3))
            # The model: the lowest start of `count` free blocks in a row, if any.
            expected = next((s for s in range(size - count + 1) if not any(used[s:s + count])), None)
            start = pool.allocate(count)
            assert start == expected
            if start is not None:
                runs[start] = count
                for i in range(start, start + count):
                    used[i] = True
        pool.check_invariants(runs)
        assert pool.num_free_blocks == used.count(False)
