"""Closed-loop (fixed concurrency) and open-loop (Poisson) levels, run under anyio.

Structured concurrency: each level owns one task group; a Ctrl-C (SIGINT/SIGTERM) cancels the
current level's scope, which cancels its in-flight requests (their records stay, marked
``cancelled``), ends the run, and still returns every finished level plus the partial one.
"""

from __future__ import annotations

import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import anyio
import httpx

from .client import ClientConfig, RequestRecord, run_request
from .metrics import LevelSummary, summarize
from .workload import ENDPOINT_PATHS, RequestSpec, WorkloadConfig, build_body, iter_specs, poisson_arrivals


@dataclass(frozen=True, slots=True)
class RunConfig:
    url: str  # server base URL, e.g. http://127.0.0.1:8000
    model: str
    workload: WorkloadConfig
    endpoint: str = "completions"  # or "chat"
    concurrency: tuple[int, ...] = ()  # closed-loop levels
    request_rates: tuple[float, ...] = ()  # open-loop levels, requests/s
    num_requests: Optional[int] = None  # per level
    duration: Optional[float] = None  # s per level (closed: stop starting; poisson: last arrival)
    max_concurrency: Optional[int] = None  # open-loop cap on in-flight requests (None: no cap)
    slo_ttft_ms: Optional[float] = None
    slo_tpot_ms: Optional[float] = None
    retry_429: int = 0
    ignore_eos: bool = True
    extra_body: Optional[dict] = None
    timeout: float = 600.0  # s, httpx connect/read/write timeout
    warmup: int = 0  # requests sent (and discarded) before the first level
    wait_ready: float = 0.0  # s to wait for the server to answer a 1-token request (0: no wait)

    def __post_init__(self) -> None:
        if self.num_requests is None and self.duration is None:
            raise ValueError("give num_requests or duration")
        if not self.concurrency and not self.request_rates:
            raise ValueError("give concurrency levels or request rates")
        if any(c < 1 for c in self.concurrency):
            raise ValueError("concurrency must be >= 1")
        if self.endpoint not in ENDPOINT_PATHS:
            raise ValueError(f"endpoint must be one of {sorted(ENDPOINT_PATHS)}")


@dataclass(slots=True)
class LevelResult:
    summary: LevelSummary
    records: list[RequestRecord]


@dataclass(slots=True)
class RunResult:
    levels: list[LevelResult] = field(default_factory=list)
    interrupted: bool = False
    error: Optional[str] = None  # why the run stopped before its levels (server never ready)


class _Stopper:
    """Holds the running level's cancel scope so a signal can stop the run cleanly."""

    def __init__(self) -> None:
        self.stopped = False
        self.scope: Optional[anyio.CancelScope] = None

    def stop(self) -> None:
        self.stopped = True
        if self.scope is not None:
            self.scope.cancel()


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class Runner:
    """Runs the levels of one RunConfig against one shared ``httpx.AsyncClient``."""

    def __init__(self, cfg: RunConfig, *, transport: Optional[httpx.AsyncBaseTransport] = None,
                 clock: Callable[[], float] = time.perf_counter, verbose: bool = True) -> None:
        self.cfg = cfg
        self.transport = transport
        self.clock = clock
        self.verbose = verbose
        self.client_cfg = ClientConfig(path=ENDPOINT_PATHS[cfg.endpoint], retry_429=cfg.retry_429)
        self.result = RunResult()  # filled as levels finish: readable even after a crash
        self._stopper = _Stopper()

    def stop(self) -> None:
        """Stop the run: cancel the running level; later levels are skipped."""
        self._stopper.stop()

    def _client(self) -> httpx.AsyncClient:
        cfg = self.cfg
        # One connection per concurrent request; an uncapped open loop gets no limit at all so
        # that client-side pool queueing never hides server latency.
        limit: Optional[int] = max(cfg.concurrency, default=1)
        if cfg.request_rates:
            limit = None if cfg.max_concurrency is None else max(limit, cfg.max_concurrency)
        limits = httpx.Limits(max_connections=limit, max_keepalive_connections=limit)
        timeout = httpx.Timeout(cfg.timeout, pool=None)
        return httpx.AsyncClient(base_url=cfg.url, transport=self.transport, limits=limits,
                                 timeout=timeout)

    async def run(self, *, handle_signals: bool = False) -> RunResult:
        """Run every level; returns (and keeps in ``self.result``) what finished, even when
        stopped. ``handle_signals``: SIGINT/SIGTERM stop the run instead of raising."""
        async with self._client() as client, anyio.create_task_group() as tg:
            if handle_signals:
                tg.start_soon(self._watch_signals)
            try:
                await self._run_levels(client)
            finally:
                tg.cancel_scope.cancel()  # the signal watcher
        self.result.interrupted = self._stopper.stopped
        return self.result

    async def _run_levels(self, client: httpx.AsyncClient) -> None:
        cfg = self.cfg
        if cfg.wait_ready > 0 and not await self._wait_ready(client):
            return
        if cfg.warmup and not self._stopper.stopped:
            await self._warmup(client)
        for c in cfg.concurrency:
            if self._stopper.stopped:
                return
            await self._level(client, f"c{c}", self._closed(client, c), concurrency=c)
        for rate in cfg.request_rates:
            if self._stopper.stopped:
                return
            await self._level(client, f"rate={rate:g}", self._poisson(client, rate),
                              request_rate=rate, concurrency=cfg.max_concurrency)

    async def _watch_signals(self) -> None:
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for _ in signals:
                _log("\ninterrupted: stopping, results so far follow")
                self.stop()

    async def _wait_ready(self, client: httpx.AsyncClient) -> bool:
        """Poll with a real 1-token request (works for any server, unlike health routes)."""
        spec = RequestSpec(0, [1, 2, 3, 4], 4, 1)
        if self.cfg.workload.text_prompts or self.cfg.endpoint == "chat":
            spec = RequestSpec(0, "hello there", 2, 1)
        deadline = anyio.current_time() + self.cfg.wait_ready
        with anyio.CancelScope() as scope:
            self._stopper.scope = scope
            while True:
                rec = RequestRecord(0)
                await self._send(client, spec, rec)
                if rec.status == "ok":
                    break
                if anyio.current_time() >= deadline:
                    self.result.error = (f"server not ready after {self.cfg.wait_ready:g} s: "
                                         f"{rec.status} {rec.http_status} {rec.error}")
                    _log(f"error: {self.result.error}")
                    break
                await anyio.sleep(min(1.0, self.cfg.wait_ready / 10))
        self._stopper.scope = None
        if self.result.error is not None:
            return False
        if self.verbose and not self._stopper.stopped:
            _log("server ready")
        return True

    async def _warmup(self, client: httpx.AsyncClient) -> None:
        records: list[RequestRecord] = []
        specs = iter_specs(self.cfg.workload, "warmup")
        with anyio.CancelScope() as scope:
            self._stopper.scope = scope
            async with anyio.create_task_group() as tg:
                for _ in range(self.cfg.warmup):
                    spec = next(specs)
                    rec = RequestRecord(spec.index)
                    records.append(rec)
                    tg.start_soon(self._send, client, spec, rec)
        self._stopper.scope = None
        bad = sum(r.status != "ok" for r in records)
        if self.verbose:
            _log(f"warmup: {len(records)} requests, {bad} not ok")

    async def _level(self, client, name: str, body, *, concurrency=None, request_rate=None) -> None:
        records: list[RequestRecord] = []
        t0 = self.clock()
        cpu0, wall0 = time.process_time(), time.perf_counter()
        with anyio.CancelScope() as scope:
            self._stopper.scope = scope
            if self._stopper.stopped:
                scope.cancel()
            await body(records, t0)
        self._stopper.scope = None
        summary = summarize(
            records, name=name, mode="closed" if request_rate is None else "poisson",
            duration_s=self.clock() - t0, concurrency=concurrency, request_rate=request_rate,
            slo_ttft_ms=self.cfg.slo_ttft_ms, slo_tpot_ms=self.cfg.slo_tpot_ms,
            interrupted=scope.cancelled_caught or self._stopper.stopped)
        summary.client_cpu = (time.process_time() - cpu0) / max(time.perf_counter() - wall0, 1e-9)
        self.result.levels.append(LevelResult(summary, records))
        if self.verbose:
            _log(f"{name}: {summary.num_ok} ok, {summary.num_errors} errors, {summary.num_429} 429, "
                 f"{summary.num_cancelled} cancelled, "
                 f"{summary.output_throughput:.1f} out tok/s in {summary.duration_s:.1f} s, "
                 f"client CPU {100 * summary.client_cpu:.0f}%")
            if summary.client_cpu > 0.8:
                _log(f"warning: the load generator was busy {100 * summary.client_cpu:.0f}% of "
                     f"{name}: its latencies may include client-side delay")

    async def _send(self, client: httpx.AsyncClient, spec: RequestSpec, rec: RequestRecord) -> None:
        body = build_body(spec, self.cfg.model, self.cfg.endpoint, ignore_eos=self.cfg.ignore_eos,
                          extra=self.cfg.extra_body)
        known = spec.prompt_len if isinstance(spec.prompt, list) else None
        await run_request(client, body, rec, self.client_cfg, self.clock, known_prompt_tokens=known)

    def _closed(self, client: httpx.AsyncClient, concurrency: int):
        cfg = self.cfg

        async def body(records: list[RequestRecord], t0: float) -> None:
            specs = iter_specs(cfg.workload, f"closed/{concurrency}")
            deadline = None if cfg.duration is None else anyio.current_time() + cfg.duration

            async def worker() -> None:
                while True:
                    if cfg.num_requests is not None and len(records) >= cfg.num_requests:
                        return
                    if deadline is not None and anyio.current_time() >= deadline:
                        return
                    spec = next(specs)
                    rec = RequestRecord(spec.index, start=self.clock() - t0)
                    records.append(rec)
                    await self._send(client, spec, rec)

            async with anyio.create_task_group() as tg:
                for _ in range(concurrency):
                    tg.start_soon(worker)

        return body

    def arrival_schedule(self, rate: float) -> list[float]:
        """The open-loop level's arrival times (s from the level start); deterministic."""
        return poisson_arrivals(rate, self.cfg.workload.seed, self.cfg.num_requests,
                                self.cfg.duration, f"poisson/{rate:g}")

    def _poisson(self, client: httpx.AsyncClient, rate: float):
        cfg = self.cfg

        async def body(records: list[RequestRecord], t0: float) -> None:
            arrivals = self.arrival_schedule(rate)
            specs = iter_specs(cfg.workload, f"poisson/{rate:g}")
            limiter = anyio.CapacityLimiter(cfg.max_concurrency) if cfg.max_concurrency else None
            start = anyio.current_time()

            async def one(spec: RequestSpec, rec: RequestRecord, at: float) -> None:
                if limiter is None:
                    await self._timed_send(client, spec, rec, t0, start, at)
                else:
                    async with limiter:
                        await self._timed_send(client, spec, rec, t0, start, at)

            async with anyio.create_task_group() as tg:
                for at in arrivals:
                    await anyio.sleep_until(start + at)
                    spec = next(specs)
                    rec = RequestRecord(spec.index)
                    records.append(rec)
                    tg.start_soon(one, spec, rec, at)

        return body

    async def _timed_send(self, client, spec, rec, t0: float, start: float, at: float) -> None:
        rec.start = self.clock() - t0
        rec.sched_lag = anyio.current_time() - start - at
        await self._send(client, spec, rec)
