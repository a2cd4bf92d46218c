"""Engine statistics handed to observers (Prometheus metrics, request logs). Immutable records."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Protocol


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


class EngineObserver(Protocol):
    """Called on the event loop thread; must be quick and must not raise."""

    def on_step(self, stats: StepStats) -> None: ...

    def on_request_done(self, stats: RequestStats) -> None: ...

    def on_rejected(self, reason: str) -> None:  # "overloaded" | "invalid" | "dead"
        ...
