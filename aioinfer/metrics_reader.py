"""Metrics as Python values: what ``LLM.get_metrics()`` returns, in the shape of vLLM's
``vllm.v1.metrics.reader``, so that a script written against vLLM's offline metrics reads these.

One record per labelled series of every ``vllm:`` family in a Prometheus registry: a ``Counter``
(named as its family, without the exposition's ``_total``), a ``Gauge``, a ``Histogram`` (its
cumulative buckets by upper bound as exposed, ``"+Inf"`` included), and a ``Vector`` for the one
counter family that is really an array, speculative decoding's accepted tokens per draft position.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from prometheus_client import CollectorRegistry

PREFIX = "vllm:"
# A counter labelled by "position": one Vector of its values, position 0 first (vLLM's one case).
_VECTOR_FAMILIES = {"vllm:spec_decode_num_accepted_tokens_per_pos": "position"}


@dataclass(frozen=True, slots=True)
class Metric:
    name: str  # the family's name, e.g. "vllm:prompt_tokens"
    labels: dict[str, str]  # the series' labels (model_name, engine, ...)


@dataclass(frozen=True, slots=True)
class Counter(Metric):
    value: int  # total since the engine started


@dataclass(frozen=True, slots=True)
class Gauge(Metric):
    value: float  # as of the last step


@dataclass(frozen=True, slots=True)
class Vector(Metric):
    values: list[int]  # one counter per position, position 0 first; positions never counted read 0


@dataclass(frozen=True, slots=True)
class Histogram(Metric):
    count: int  # observations (= buckets["+Inf"])
    sum: float  # of the observed values
    buckets: dict[str, int]  # upper bound as exposed ("0.005", ..., "+Inf") -> observations <= it


def read_metrics(registry: CollectorRegistry, prefix: str = PREFIX) -> list[Metric]:
    """Every series of the registry's families named ``prefix...``, in the registry's order."""
    found: list[Metric] = []
    for family in registry.collect():
        if not family.name.startswith(prefix):
            continue
        if family.type == "counter" and family.name in _VECTOR_FAMILIES:
            found.extend(_vectors(family, _VECTOR_FAMILIES[family.name]))
        elif family.type == "counter":
            found.extend(Counter(family.name, dict(s.labels), int(s.value)) for s in _samples(family, "_total"))
        elif family.type == "gauge":
            found.extend(Gauge(family.name, dict(s.labels), float(s.value)) for s in _samples(family, ""))
        elif family.type == "histogram":
            found.extend(_histograms(family))
        # other types (summary, info, ...) have no record here; aioinfer exposes none under vllm:
    return found


def _samples(family, suffix: str) -> Iterable:
    name = family.name + suffix
    return [s for s in family.samples if s.name == name]


def _key(labels: dict[str, str], without: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in labels.items() if k != without))


def _histograms(family) -> list[Histogram]:
    buckets: dict[tuple, dict[str, int]] = {}
    counts: dict[tuple, int] = {}
    sums: dict[tuple, float] = {}
    for s in family.samples:
        if s.name == family.name + "_bucket":
            buckets.setdefault(_key(s.labels, "le"), {})[s.labels["le"]] = int(s.value)
        elif s.name == family.name + "_count":
            counts[_key(s.labels, "")] = int(s.value)
        elif s.name == family.name + "_sum":
            sums[_key(s.labels, "")] = float(s.value)
    return [Histogram(family.name, dict(key), count=counts.get(key, by_bound.get("+Inf", 0)),
                      sum=sums.get(key, 0.0), buckets=by_bound)
            for key, by_bound in buckets.items()]


def _vectors(family, position_label: str) -> list[Vector]:
    by_series: dict[tuple, dict[int, int]] = {}
    for s in _samples(family, "_total"):
        by_series.setdefault(_key(s.labels, position_label), {})[int(s.labels[position_label])] = int(s.value)
    vectors = []
    for key, by_position in by_series.items():
        values = [0] * (max(by_position) + 1)
        for position, value in by_position.items():
            values[position] = value
        vectors.append(Vector(family.name, dict(key), values))
    return vectors
