"""Typed exceptions at the edges: each maps to one HTTP status in the server."""

from __future__ import annotations


class AioinferError(Exception):
    """Base class of aioinfer's own errors."""


class EngineOverloaded(AioinferError):
    """Admission is full (too many waiting requests or prompt tokens): retry later (HTTP 429)."""

    def __init__(self, message: str, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after  # seconds


class AdmissionLimitExceeded(AioinferError, ValueError):
    """The request (all of its prompts x n at once) needs more than an admission bound allows even
    with an empty queue: it can never be admitted, so retrying is pointless (HTTP 400)."""

    def __init__(self, message: str, bound: str, limit: int, needed: int) -> None:
        super().__init__(message)
        self.bound = bound  # "max_waiting_requests" | "max_waiting_prompt_tokens"
        self.limit = limit  # the bound's value
        self.needed = needed  # what the request needs of it


class EngineDeadError(AioinferError):
    """The step loop failed; every open request gets this and new ones are refused (HTTP 503)."""


class EngineNotReady(AioinferError):
    """The engine has not started (or is shutting down) (HTTP 503)."""


class SlowConsumerError(AioinferError):
    """The consumer stopped reading for longer than the stall limit; its request was aborted."""


class RequestDeadlineExceeded(AioinferError, TimeoutError):
    """The request's deadline passed before it finished; it was aborted."""


class TensorParallelError(AioinferError, ValueError):
    """The model cannot be split over the requested tensor-parallel size (e.g. heads not divisible)."""


class WorkerProcessError(AioinferError, RuntimeError):
    """A tensor-parallel worker process failed or disappeared; the engine cannot go on."""
