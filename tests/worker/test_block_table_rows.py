"""The persistent block-table rows mirror each request's table list exactly, step after step."""

from __future__ import annotations

import numpy as np

from aioinfer.core.scheduler_output import ScheduledRequest
from aioinfer.worker.input_buffers import _BlockTableRows


def _gathered(rows: _BlockTableRows, scheduled, width: int) -> list[list[int]]:
    picked = rows.rows_for(scheduled)  # first: it may grow the array
    return [list(r) for r in np.take(rows.table[:, :width], picked, axis=0)]


def test_rows_follow_growth_new_tables_and_reuse():
    rows = _BlockTableRows(num_rows=2, max_blocks=8)
    tables = {"a": [5, 6], "b": [9]}

    def step(*ids):
        scheduled = [ScheduledRequest(i, [1], 0, tables[i], True) for i in ids]
        width = max(len(tables[i]) for i in ids)
        return _gathered(rows, scheduled, width)

    assert step("a", "b") == [[5, 6], [9, 0]]
    tables["a"].append(7)  # the KV manager's list grows in place
    assert step("b", "a") == [[9, 0, 0], [5, 6, 7]]
    tables["a"] = [3]  # preempted and readmitted: a new, shorter list
    assert step("a") == [[3]]
    assert step("a", "b") == [[3], [9]]
    tables["c"] = [1, 2, 3, 4]
    assert step("a", "b", "c") == [[3, 0, 0, 0], [9, 0, 0, 0], [1, 2, 3, 4]]  # rows doubled
    rows.forget(["a", "c"])
    tables["d"] = [8, 8]
    assert step("d", "b") == [[8, 8], [9, 0]]  # a freed row, rewritten whole
