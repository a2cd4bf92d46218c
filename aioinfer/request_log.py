"""Structured request logs: one JSON line per request on the ``aioinfer.requests`` logger.

An ``EngineObserver``. Lines carry ids, status, token counts and timings — never prompt or
output text, which may be private. HTTP errors that never reached the engine (validation, auth)
get their own line from the app through ``log_http_error``. A line is one JSON object (orjson escapes
every control character, so no client string can end it or start another); the strings a client
chooses there (its X-Request-Id, the path) are also cut to ``CLIENT_STRING_CHARS``.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any, Optional

import orjson

from aioinfer.async_engine.stats import RequestStats, StepStats

LOGGER_NAME = "aioinfer.requests"
CLIENT_STRING_CHARS = 256  # of a client's string in a line: an id or a path, not a payload


class RequestLog:
    def __init__(self, logger: Optional[logging.Logger] = None) -> None:
        self.logger = logger or logging.getLogger(LOGGER_NAME)

    def emit(self, event: str, **fields: Any) -> None:
        if not self.logger.isEnabledFor(logging.INFO):
            return
        record = {"ts": round(time.time(), 6), "event": event, **fields}
        self.logger.info(orjson.dumps(record).decode())

    # ---------------------------------------------------------------- EngineObserver

    def on_step(self, stats: StepStats) -> None:  # steps are metrics, not log lines
        pass

    def on_request_done(self, stats: RequestStats) -> None:
        try:
            self.emit(
                "request",
                request_id=stats.request_id,
                status=stats.status,
                finish_reason=stats.finish_reason,
                abort_cause=stats.abort_cause,
                prompt_tokens=stats.num_prompt_tokens,
                output_tokens=stats.num_output_tokens,
                cached_tokens=stats.num_cached_tokens,
                queue_time=_round(stats.queue_time),
                ttft=_round(stats.ttft),
                duration=_round(stats.e2e_latency),
                preemptions=stats.num_preemptions,
            )
        except Exception:  # noqa: BLE001 - observers must not raise
            logging.getLogger(__name__).exception("request log failed")

    def on_rejected(self, reason: str) -> None:
        try:
            self.emit("rejected", reason=reason)
        except Exception:  # noqa: BLE001
            logging.getLogger(__name__).exception("request log failed")

    # ---------------------------------------------------------------- server side

    def log_http_error(self, *, request_id: Optional[str], method: str, path: str, status: int,
                       code: Optional[str]) -> None:
        self.emit("http_error", request_id=_clip(request_id), method=_clip(method), path=_clip(path), status=status,
                  code=code)


def configure_request_logger(enabled: bool) -> None:
    """Give the request logger a bare stderr handler (the lines are already JSON) unless one exists."""
    logger = logging.getLogger(LOGGER_NAME)
    if not enabled:
        logger.setLevel(logging.WARNING)
        return
    logger.setLevel(logging.INFO)
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
        logger.propagate = False


def _clip(value: Optional[str]) -> Optional[str]:
    if value is None or len(value) <= CLIENT_STRING_CHARS:
        return value
    return value[:CLIENT_STRING_CHARS] + "..."


def _round(value: Optional[float]) -> Optional[float]:
    return None if value is None else round(value, 6)
