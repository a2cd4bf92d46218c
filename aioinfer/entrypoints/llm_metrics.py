"""The offline ``LLM``'s metrics: vLLM's families, recorded by the server's own recorder
(metrics.PrometheusMetrics) from the steps ``LLM.generate`` runs, read by ``LLM.get_metrics()``.

The async engine hands its observers a ``StepStats`` per step and a ``RequestStats`` per finished
request; the offline loop has no engine thread or observers, so this builds the same two records
from what the loop already holds: per step, counts the scheduler and the runner report (no tensor
is read), one clock read, and per request with news in the step, a few assignments; per finished
request, one record. The requests' clock is the caller's: arrival when ``generate`` queued them.

KV swap timings (``aioinfer:kv_swap_*``) are left to whoever takes them from the engine core: they
are no vLLM family, and taking them here would leave nothing for ``EngineCore.take_swap_timings``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional

from aioinfer.async_engine.stats import RequestStats, StepStats
from aioinfer.metrics import PrometheusMetrics
from aioinfer.metrics_reader import Metric, read_metrics


@dataclass(slots=True)
class _Timing:
    """One open request's clock (time.monotonic() values) and counts."""

    arrival: float
    num_prompt_tokens: int
    scheduled_at: Optional[float] = None  # start of its first scheduled step
    first_token_at: Optional[float] = None
    last_token_at: Optional[float] = None
    inter_token: list[float] = field(default_factory=list)  # seconds between its token deliveries
    num_output_tokens: int = 0
    num_cached_tokens: int = 0
    num_preemptions: int = 0


class OfflineMetrics:
    def __init__(self, model: str) -> None:
        self.prometheus = PrometheusMetrics(model_label(model))
        self._open: dict[str, _Timing] = {}

    def read(self) -> list[Metric]:
        return read_metrics(self.prometheus.registry)

    def add_request(self, request_id: str, num_prompt_tokens: int, now: float) -> None:
        self._open[request_id] = _Timing(arrival=now, num_prompt_tokens=num_prompt_tokens)

    def record_step(self, core, scheduler_output, runner_output, outputs, deltas, step_start: float) -> None:
        """One ``core.step_with_details()`` (started at ``step_start``) and the deltas its outputs made."""
        now = time.monotonic()
        open_requests = self._open
        for new in scheduler_output.new_requests:
            timing = open_requests.get(new.request_id)
            if timing is not None and timing.scheduled_at is None:
                timing.scheduled_at = step_start
        for out in outputs:
            if out.num_preemptions:  # cumulative per request; rare, so no lookup otherwise
                timing = open_requests.get(out.request_id)
                if timing is not None:
                    timing.num_preemptions = out.num_preemptions
        self.prometheus.on_step(StepStats.of_step(core, scheduler_output, runner_output, now - step_start))
        for delta in deltas:
            timing = open_requests.get(delta.request_id)
            if timing is None:
                continue
            if delta.token_ids:
                if timing.first_token_at is None:
                    timing.first_token_at = now
                else:
                    timing.inter_token.append(now - timing.last_token_at)
                timing.last_token_at = now
            timing.num_output_tokens = delta.num_output_tokens
            timing.num_cached_tokens = delta.num_cached_tokens
            if delta.finish_reason is not None:
                del open_requests[delta.request_id]
                self.prometheus.on_request_done(_request_stats(delta.request_id, timing, delta.finish_reason, now))

    def abandon(self) -> None:
        """``generate`` failed or was interrupted: its requests were aborted, and are not counted."""
        self._open.clear()


def model_label(model: str) -> str:
    """The ``model_name`` label: the server's default name for the same model (its folder's or
    file's name), so that offline and served figures line up."""
    from aioinfer.fetch import DEFAULT_MODEL, DEFAULT_MODEL_ALIASES

    return DEFAULT_MODEL if model in DEFAULT_MODEL_ALIASES else model.rstrip("/").rsplit("/", 1)[-1]


def _request_stats(request_id: str, timing: _Timing, finish_reason: str, now: float) -> RequestStats:
    first = timing.first_token_at
    return RequestStats(
        request_id=request_id, status="finished", finish_reason=finish_reason, abort_cause=None,
        num_prompt_tokens=timing.num_prompt_tokens, num_output_tokens=timing.num_output_tokens,
        num_cached_tokens=timing.num_cached_tokens,
        queue_time=None if timing.scheduled_at is None else timing.scheduled_at - timing.arrival,
        ttft=None if first is None else first - timing.arrival,
        e2e_latency=now - timing.arrival,
        inter_token_latencies=tuple(timing.inter_token),
        num_preemptions=timing.num_preemptions,
        decode_time=None if first is None else timing.last_token_at - first,
    )
