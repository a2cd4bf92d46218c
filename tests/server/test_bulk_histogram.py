"""BulkHistogram exposes what prometheus_client's Histogram would for the same observations."""

from __future__ import annotations

import random

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from aioinfer.metrics import BulkHistogram

BUCKETS = (0.01, 0.025, 0.05, 1.0)


def test_bulk_observations_render_as_a_histogram_would():
    rng = random.Random(0)
    values = [rng.choice([0.01, 0.025, 0.05, 1.0, 3.0, rng.random()]) for _ in range(500)]  # bounds included
    reference, bulk = CollectorRegistry(), CollectorRegistry()
    hist = Histogram("gap_seconds", "doc", ["engine"], buckets=BUCKETS, registry=reference)
    fast = BulkHistogram("gap_seconds", "doc", ["engine"], BUCKETS, registry=bulk)
    for i, value in enumerate(values):
        hist.labels(str(i % 2)).observe(value)
    fast.labels("0").observe_many(values[0::2])
    for value in values[1::2]:
        fast.labels("1").observe(value)

    def lines(registry):
        return [line for line in generate_latest(registry).decode().splitlines() if "_created" not in line]

    assert lines(bulk) == lines(reference)
