"""One streaming request: send, parse the SSE stream, time every content chunk.

Timing (all in seconds, from the moment the request is first sent, so a 429 retry's wait counts
toward what the user saw):

- ``ttft``: arrival of the first chunk with non-empty content (completions ``text``, chat
  ``delta.content``); role-only and usage-only chunks do not count.
- ``itl``: gaps between consecutive non-empty content chunks (inter-chunk latency; a server that
  batches several tokens into one chunk shows fewer, longer gaps).
- ``e2e``: ``data: [DONE]`` (or the error event, or the close of a stream cut short).
- ``output_tokens``: the usage chunk's ``completion_tokens``, else the number of content chunks.
"""

from __future__ import annotations

import email.utils
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Optional

import anyio
import httpx

try:  # orjson is faster but optional (the GPU machine may lack it)
    import orjson

    _loads: Callable[[Any], Any] = orjson.loads
except ImportError:  # pragma: no cover
    import json

    _loads = json.loads

# Statuses of a RequestRecord
OK = "ok"
HTTP_ERROR = "http_error"  # non-2xx other than 429 (http_status says which)
RATE_LIMITED = "rate_limited"  # 429, and not retried (or retries exhausted)
EXCEPTION = "exception"  # connection error, timeout, ...
STREAM_ERROR = "stream_error"  # an {"error": ...} event, bad JSON, or a stream cut before [DONE]
CANCELLED = "cancelled"  # stopped by Ctrl-C / level cancellation; excluded from statistics


@dataclass(slots=True)
class RequestRecord:
    """What happened to one request."""

    index: int  # RequestSpec.index within its level
    status: str = CANCELLED  # one of the status constants above
    http_status: Optional[int] = None  # last HTTP status seen
    error: Optional[str] = None  # message for any non-ok status
    start: float = 0.0  # s, send time relative to the level start
    sched_lag: float = 0.0  # s, open loop: how late the send was versus its Poisson arrival time
    ttft: Optional[float] = None  # s
    itl: list[float] = field(default_factory=list)  # s, one per gap between content chunks
    e2e: Optional[float] = None  # s
    output_tokens: int = 0  # tokens (usage) or content chunks (fallback)
    prompt_tokens: Optional[int] = None  # usage prompt_tokens, else the known token-id length
    num_chunks: int = 0  # non-empty content chunks received
    usage_reported: bool = False  # True when output_tokens came from a usage chunk
    retries_429: int = 0  # 429 responses received (each retried one, and a final one)

    @property
    def tpot(self) -> Optional[float]:
        """s per output token after the first: (e2e - ttft) / (output_tokens - 1)."""
        if self.ttft is None or self.e2e is None or self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)

    def to_json(self) -> dict:
        out = {f: getattr(self, f) for f in self.__slots__}  # type: ignore[attr-defined]
        out["tpot"] = self.tpot
        return out


async def iter_sse_data(lines: AsyncIterator[str]) -> AsyncIterator[str]:
    """Yield each SSE event's data (multi-line ``data:`` fields joined by newlines).

    Comments (``:``) and other fields (``event:``, ``id:``, ``retry:``) are skipped; an event is
    dispatched at its blank line, or at the end of the stream if the server omits the last one.
    """
    buf: list[str] = []
    async for raw in lines:
        line = raw.rstrip("\r\n")
        if not line:
            if buf:
                yield "\n".join(buf)
                buf = []
            continue
        if line.startswith("data:"):
            value = line[5:]
            buf.append(value[1:] if value.startswith(" ") else value)
    if buf:
        yield "\n".join(buf)


def chunk_text(chunk: dict) -> str:
    """Content text of a completions or chat chunk ("" for role-only / usage-only chunks)."""
    parts = []
    for choice in chunk.get("choices") or ():
        text = choice.get("text")
        if text is None:
            delta = choice.get("delta") or {}
            text = delta.get("content")
        if text:
            parts.append(text)
    return "".join(parts)


def parse_retry_after(value: Optional[str], default: float) -> float:
    """Retry-After as seconds (delta-seconds, fractions allowed, or an HTTP date); >= 0."""
    if not value:
        return default
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
        return max(0.0, when.timestamp() - time.time())
    except (TypeError, ValueError):
        return default


def _error_message(body: bytes) -> str:
    try:
        data = _loads(body)
        err = data.get("error", data) if isinstance(data, dict) else data
        if isinstance(err, dict):
            return str(err.get("message", err))
        return str(err)
    except Exception:
        return body[:200].decode("utf-8", "replace")


@dataclass(frozen=True, slots=True)
class ClientConfig:
    path: str = "/v1/completions"
    retry_429: int = 0  # retries after a 429 (0: count it and give up)
    retry_after_default: float = 1.0  # s, when a 429 has no usable Retry-After
    retry_after_max: float = 60.0  # s, cap on one wait


async def run_request(client: httpx.AsyncClient, body: dict, record: RequestRecord,
                      cfg: ClientConfig, clock: Callable[[], float] = time.perf_counter,
                      known_prompt_tokens: Optional[int] = None) -> RequestRecord:
    """Send one streaming request and fill ``record`` in place (so a cancelled request still
    leaves what it had). Never raises, except the cancellation exception itself."""
    t0 = clock()
    record.prompt_tokens = known_prompt_tokens
    try:
        while True:
            async with client.stream("POST", cfg.path, json=body) as resp:
                record.http_status = resp.status_code
                if resp.status_code == 429:
                    record.retries_429 += 1
                    wait = min(cfg.retry_after_max, parse_retry_after(
                        resp.headers.get("retry-after"), cfg.retry_after_default))
                    record.error = _error_message(await resp.aread())
                    if record.retries_429 > cfg.retry_429:
                        record.status = RATE_LIMITED
                        record.e2e = clock() - t0
                        return record
                elif resp.status_code >= 300:
                    record.status = HTTP_ERROR
                    record.error = _error_message(await resp.aread())
                    record.e2e = clock() - t0
                    return record
                else:
                    await _read_stream(resp, record, clock, t0)
                    return record
            await anyio.sleep(wait)  # outside the `async with`: the connection goes back first
    except Exception as exc:  # httpx errors, OSError, a malformed response: one failed request,
        # not a failed run (cancellation is a BaseException and passes through). A failure while
        # draining after [DONE] or an error event leaves that outcome as it was.
        if record.status == CANCELLED:
            record.status = EXCEPTION
            record.error = f"{type(exc).__name__}: {exc}"
    if record.e2e is None:
        record.e2e = clock() - t0
    return record


async def _read_stream(resp: httpx.Response, record: RequestRecord,
                       clock: Callable[[], float], t0: float) -> None:
    # After [DONE] or an error event the rest of the body is still read (normally just the
    # chunked-encoding terminator): a response closed unread costs its keep-alive connection,
    # and the next request would pay a new connect in its TTFT.
    last: Optional[float] = None
    finished = False  # [DONE], an error event or bad JSON seen
    record.status = CANCELLED  # until the stream ends one way or another
    record.error = None  # a retried 429's message no longer applies
    async for data in iter_sse_data(resp.aiter_lines()):
        if finished:
            continue
        now = clock()
        if data.strip() == "[DONE]":
            finished = True
            record.status = OK
            record.e2e = now - t0
            continue
        try:
            chunk = _loads(data)
        except ValueError:
            finished = True
            record.status, record.error = STREAM_ERROR, f"bad JSON in stream: {data[:100]!r}"
            record.e2e = now - t0
            continue
        if not isinstance(chunk, dict):
            continue
        if chunk.get("error") is not None:
            err = chunk["error"]
            finished = True
            record.status = STREAM_ERROR
            record.error = str(err.get("message", err)) if isinstance(err, dict) else str(err)
            record.e2e = now - t0
            continue
        if chunk_text(chunk):
            record.num_chunks += 1
            if last is None:
                record.ttft = now - t0
            else:
                record.itl.append(now - last)
            last = now
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            if usage.get("completion_tokens") is not None:
                record.output_tokens = int(usage["completion_tokens"])
                record.usage_reported = True
            if usage.get("prompt_tokens") is not None:
                record.prompt_tokens = int(usage["prompt_tokens"])
    if not record.usage_reported:
        record.output_tokens = record.num_chunks
    if not finished:
        record.e2e = clock() - t0
        record.status, record.error = STREAM_ERROR, "stream ended without [DONE]"
