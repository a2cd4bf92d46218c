"""Engine statistics handed to observers (Prometheus metrics, request logs). Immutable records."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Protocol

from aioinfer.core.scheduler_output import SwapTiming

if TYPE_CHECKING:
    from aioinfer.async_engine.request_channel import RequestChannel

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class StepStats:
    """One engine step, reported on the event loop after the step's outputs are delivered."""

    num_running: int  # requests holding KV after the step
    num_waiting: int  # requests queued (including preempted ones)
    kv_usage: float  # fraction of usable KV blocks in use, [0, 1]
    num_batched_requests: int  # requests computed in this step
    num_scheduled_tokens: int  # tokens computed in this step (prefill + decode)
    num_generation_tokens: int  # tokens sampled in this step
    num_preempted: int  # requests preempted in this step
    step_time: float  # seconds the step took on the GPU thread
    engine_index: int = 0  # the data-parallel replica that ran it (0 without data parallelism)
    swaps: tuple[SwapTiming, ...] = ()  # KV swap copies whose timing completed since the last report
    num_prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache by this step's admissions
    num_prefix_cache_hits: int = 0  # of those, tokens served from the cache
    # Prompt lengths of the requests that sampled their first token in this step (vLLM's prompt
    # tokens of an iteration: a prompt counts once, when its prefill is complete, whatever its chunks).
    num_prefilled_prompt_tokens: int = 0
    # Speculative decoding in this step: requests whose drafts were verified, their draft tokens, the
    # accepted ones, and per draft position how many were accepted (vLLM's spec_decode counters).
    num_spec_drafts: int = 0
    num_spec_draft_tokens: int = 0
    num_spec_accepted_tokens: int = 0
    spec_accepted_per_position: tuple[int, ...] = ()

    @classmethod
    def of_step(cls, core, scheduler_output, runner_output, step_time: float, swaps: tuple = ()) -> "StepStats":
        """The step ``core.step_with_details`` just ran (the async step loop's and the offline
        ``LLM``'s metrics read the same figures)."""
        scheduler = core.scheduler
        spec = scheduler.draft_policy.take_step_counts() if scheduler.draft_policy is not None else None
        return cls(
            num_running=len(scheduler.running),
            num_waiting=len(scheduler.waiting),
            kv_usage=core.kv_cache.usage(),
            num_batched_requests=len(scheduler_output.scheduled),
            num_scheduled_tokens=scheduler_output.num_scheduled_tokens,
            num_generation_tokens=runner_output.num_tokens,
            num_preempted=scheduler_output.num_preempted,
            step_time=step_time,
            swaps=swaps,
            num_prefix_cache_queries=scheduler_output.num_prefix_cache_queries,
            num_prefix_cache_hits=scheduler_output.num_prefix_cache_hits,
            num_prefilled_prompt_tokens=scheduler.last_prefilled_prompt_tokens,
            **({} if spec is None else dict(
                num_spec_drafts=spec.num_drafts, num_spec_draft_tokens=spec.num_draft_tokens,
                num_spec_accepted_tokens=spec.num_accepted_tokens,
                spec_accepted_per_position=tuple(spec.accepted_per_position))),
        )


@dataclass(frozen=True, slots=True)
class RequestStats:
    """One request's life, reported once when it ends (finished, aborted or failed)."""

    request_id: str
    status: str  # "finished" | "aborted" | "error"
    finish_reason: Optional[str]  # "stop" | "length" | "abort" | None on error
    abort_cause: Optional[str]  # "client" | "deadline" | "slow_consumer" | "shutdown" | None
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int
    queue_time: Optional[float]  # seconds from arrival to the first scheduled step (None if never ran)
    ttft: Optional[float]  # seconds from arrival to the first token
    e2e_latency: float  # seconds from arrival to the end
    inter_token_latencies: tuple[float, ...]  # seconds between consecutive token deliveries
    num_preemptions: int
    engine_index: int = 0  # the data-parallel replica that served it (0 without data parallelism)
    decode_time: Optional[float] = None  # seconds from the first token to the last one (None if none came)


class EngineObserver(Protocol):
    """Called on the event loop thread; must be quick and must not raise."""

    def on_step(self, stats: StepStats) -> None: ...

    def on_request_done(self, stats: RequestStats) -> None: ...

    def on_rejected(self, reason: str) -> None:  # "overloaded" | "invalid" | "dead"
        ...

    # Optional (called only where defined), by a DataParallelEngine for every request it routes:
    # def on_routed(self, engine_index: int, by_affinity: bool) -> None: ...


def request_stats(channel: RequestChannel, status: str, finish_reason: Optional[str], now: float) -> RequestStats:
    """The record of a request that ended at ``now`` (time.monotonic()), from its channel's timings."""
    return RequestStats(
        request_id=channel.request_id,
        status=status,
        finish_reason=finish_reason,
        abort_cause=channel.abort_cause if status == "aborted" else None,
        num_prompt_tokens=channel.num_prompt_tokens,
        num_output_tokens=channel.num_output_tokens,
        num_cached_tokens=channel.num_cached_tokens,
        queue_time=None if channel.scheduled_at is None else channel.scheduled_at - channel.arrival,
        ttft=None if channel.first_token_at is None else channel.first_token_at - channel.arrival,
        e2e_latency=now - channel.arrival,
        inter_token_latencies=tuple(channel.inter_token),
        num_preemptions=channel.num_preemptions,
        decode_time=None if channel.first_token_at is None else channel.last_token_at - channel.first_token_at,
    )


def call_observer(method, *args) -> None:
    """Call one observer hook; a failing observer is logged, never raised into the engine."""
    try:
        method(*args)
    except Exception:  # noqa: BLE001 - metrics must never break serving
        logger.exception("engine observer %r failed", method)
