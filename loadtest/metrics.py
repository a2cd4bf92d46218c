"""Per-level summary: counts, throughput, goodput and latency percentiles (numpy)."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Iterable, Optional, Sequence

import numpy as np

from .client import CANCELLED, OK, RATE_LIMITED, RequestRecord

PERCENTILES = (50, 90, 99)


@dataclass(slots=True)
class Dist:
    """Distribution of one latency in milliseconds (None fields when there were no samples)."""

    count: int = 0
    mean: Optional[float] = None
    p50: Optional[float] = None
    p90: Optional[float] = None
    p99: Optional[float] = None
    max: Optional[float] = None


def dist_ms(values_s: Sequence[float]) -> Dist:
    """Distribution of ``values_s`` (seconds) in ms; numpy's default (linear) percentiles."""
    if len(values_s) == 0:
        return Dist()
    a = np.asarray(values_s, dtype=np.float64) * 1e3
    p50, p90, p99 = np.percentile(a, PERCENTILES)
    return Dist(len(a), float(a.mean()), float(p50), float(p90), float(p99), float(a.max()))


@dataclass(slots=True)
class LevelSummary:
    """One level (a concurrency, or a request rate) of a run."""

    name: str  # "c16", "rate=4.0"
    mode: str  # "closed" or "poisson"
    concurrency: Optional[int]  # closed loop: workers; poisson: the --max-concurrency cap or None
    request_rate: Optional[float]  # req/s, poisson only
    duration_s: float  # wall time from the level's start to its last request's end
    num_sent: int  # requests started (including cancelled ones)
    num_ok: int
    num_errors: int  # failed requests other than 429s and cancellations
    num_429: int  # requests that ended rate limited
    num_429_responses: int  # all 429 responses, including retried ones
    num_cancelled: int
    errors: dict[str, int]  # "http_500", "stream_error", ... -> count (429s and cancellations too)
    output_tokens: int  # ok requests
    prompt_tokens: int  # ok requests (0 where unknown)
    output_throughput: float  # output tokens/s
    request_throughput: float  # ok requests/s
    goodput: Optional[float]  # ok requests meeting every given SLO, per s; None without SLOs
    goodput_fraction: Optional[float]  # of ok requests
    slo_ttft_ms: Optional[float]
    slo_tpot_ms: Optional[float]
    ttft: Dist = field(default_factory=Dist)
    tpot: Dist = field(default_factory=Dist)
    itl: Dist = field(default_factory=Dist)
    e2e: Dist = field(default_factory=Dist)
    interrupted: bool = False  # Ctrl-C stopped this level early
    client_cpu: Optional[float] = None  # load generator CPU s / wall s; near 1: client-bound

    def to_json(self) -> dict:
        return asdict(self)


def meets_slo(rec: RequestRecord, slo_ttft_ms: Optional[float], slo_tpot_ms: Optional[float]) -> bool:
    """True when an ok request meets every SLO given. A request with a single output token
    has no TPOT and meets any TPOT SLO; one that produced no content fails a TTFT SLO."""
    if rec.status != OK:
        return False
    if slo_ttft_ms is not None and (rec.ttft is None or rec.ttft * 1e3 > slo_ttft_ms):
        return False
    tpot = rec.tpot
    if slo_tpot_ms is not None and tpot is not None and tpot * 1e3 > slo_tpot_ms:
        return False
    return True


def error_key(rec: RequestRecord) -> str:
    if rec.status == "http_error":
        return f"http_{rec.http_status}"
    return rec.status


def summarize(records: Iterable[RequestRecord], *, name: str, mode: str, duration_s: float,
              concurrency: Optional[int] = None, request_rate: Optional[float] = None,
              slo_ttft_ms: Optional[float] = None, slo_tpot_ms: Optional[float] = None,
              interrupted: bool = False) -> LevelSummary:
    records = list(records)
    ok = [r for r in records if r.status == OK]
    errors = Counter(error_key(r) for r in records if r.status != OK)
    num_429 = errors.get(RATE_LIMITED, 0)
    num_cancelled = errors.get(CANCELLED, 0)
    out_tokens = sum(r.output_tokens for r in ok)
    dur = max(duration_s, 1e-9)
    has_slo = slo_ttft_ms is not None or slo_tpot_ms is not None
    good = sum(meets_slo(r, slo_ttft_ms, slo_tpot_ms) for r in ok) if has_slo else None
    return LevelSummary(
        name=name, mode=mode, concurrency=concurrency, request_rate=request_rate,
        duration_s=duration_s, num_sent=len(records), num_ok=len(ok),
        num_errors=len(records) - len(ok) - num_429 - num_cancelled,
        num_429=num_429, num_429_responses=sum(r.retries_429 for r in records),
        num_cancelled=num_cancelled, errors=dict(sorted(errors.items())),
        output_tokens=out_tokens, prompt_tokens=sum(r.prompt_tokens or 0 for r in ok),
        output_throughput=out_tokens / dur, request_throughput=len(ok) / dur,
        goodput=None if good is None else good / dur,
        goodput_fraction=None if good is None else (good / len(ok) if ok else 0.0),
        slo_ttft_ms=slo_ttft_ms, slo_tpot_ms=slo_tpot_ms,
        ttft=dist_ms([r.ttft for r in ok if r.ttft is not None]),
        tpot=dist_ms([t for r in ok if (t := r.tpot) is not None]),
        itl=dist_ms([x for r in ok for x in r.itl]),
        e2e=dist_ms([r.e2e for r in ok if r.e2e is not None]),
        interrupted=interrupted,
    )
