"""One request's stream from an engine replica, as ``RayEngine.generate`` returns it.

It behaves as the iterator ``Engine.generate`` returns, with one addition: ``admitted()``. A local
engine admits or refuses a request inside ``generate`` itself; a replica only answers with the
stream's first item, so the caller awaits ``admitted()`` (the server does, for every choice,
before it sends anything: fanout.py ``ChoiceStreams.confirmed``) and gets the engine's own
exception: a ValueError for bad input, ``EngineOverloaded`` with its ``retry_after``, and so on.

Failures are never a hang. A replica that dies before it admitted the request (its actor died,
and Ray's router had not noticed yet) is retried on another one: the request never started. A
replica that dies mid-stream ends the stream with ``EngineDeadError``, which the server turns into
an SSE error event or a 503. Closing the stream, or cancelling its consumer (the HTTP client went
away), cancels the Ray call; Ray then cancels ``EngineReplica.generate``, which aborts the request
in the replica's engine. ``abort(cause)`` ends it from outside (the server's shutdown, the stall
watchdog): the consumer gets a final delta with finish_reason "abort", as from a local engine.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any, Callable, Optional

import anyio

from aioinfer.async_engine.stats import RequestStats
from aioinfer.engine.delta import GenerationDelta
from aioinfer.errors import EngineDeadError, EngineOverloaded, RequestDeadlineExceeded
from aioinfer.ray.wire import ADMITTED, FINAL, error_of

if TYPE_CHECKING:
    from aioinfer.ray.client import RayEngine

logger = logging.getLogger(__name__)

# Seconds to wait before each new try of a request whose replica died before admitting it: Ray's
# router drops a dead replica once a call to it has failed, which may take a moment to be seen.
ADMISSION_RETRY_DELAYS = (0.05, 0.25, 1.0)


class RayStream:
    """Async iterator of one request's ``GenerationDelta``s from a replica (see the module docstring)."""

    def __init__(self, engine: RayEngine, request_id: str, start: Callable[[], Any], num_prompt_tokens: int,
                 deadline: Optional[float] = None, stall_probe=None) -> None:
        self.request_id = request_id
        self.num_prompt_tokens = num_prompt_tokens
        self.stall_probe = stall_probe  # the HTTP connection's (client_stall.py), read by the engine's watchdog
        self.replica_id: Optional[str] = None  # the replica that admitted it
        self._engine = engine
        self._start = start
        self._deadline = deadline
        self._response = start()  # a DeploymentResponseGenerator
        self._arrival = time.monotonic()
        self._first_token_at: Optional[float] = None
        self._num_output_tokens = 0
        self._num_cached_tokens = 0
        self._admitted = False
        self._closed = False  # nothing more will be read from Ray
        self._recorded = False  # counted and reported to the observers
        self._abort_cause: Optional[str] = None
        self._abort_error: Optional[BaseException] = None  # raised instead of the abort delta (slow consumer)
        self._error: Optional[BaseException] = None  # how the stream failed, raised again if read again

    # ------------------------------------------------------------------ admission

    async def admitted(self) -> None:
        """Wait for the replica's answer; raises what a local ``Engine.generate`` would have raised."""
        retries = iter(ADMISSION_RETRY_DELAYS)
        while not self._admitted:
            if self._error is not None:
                raise self._error
            if self._abort_cause is not None:
                return  # aborted while waiting: the iteration gives the final "abort" delta
            try:
                first = await self._next_item()
            except asyncio.CancelledError:
                self._cancel("client")
                raise
            except StopAsyncIteration:
                raise self._fail(EngineDeadError(f"request {self.request_id}: the replica ended the stream "
                                                 f"without admitting the request"))
            except Exception as exc:  # noqa: BLE001 - Ray's errors: see _ray_failure
                if self._abort_cause is not None:
                    continue
                delay = next(retries, None) if _replica_gone(exc) else None
                if delay is not None:
                    logger.info("request %s: its replica is gone (%s); trying another", self.request_id,
                                type(exc).__name__)
                    try:  # an actor only unreachable may still run it: it must not run twice
                        self._response.cancel()
                    except Exception:  # noqa: BLE001 - best effort: the replica is most likely gone
                        pass
                    await anyio.sleep(delay)
                    if self._abort_cause is None:
                        self._response = self._start()
                    continue
                raise self._fail(_ray_failure(exc, self.request_id))
            if first[0] == ADMITTED:
                self._admitted = True
                self.replica_id = first[1]
            else:
                exc = error_of(first)
                self._engine._on_refused(exc)
                raise self._fail(exc, refused=True)

    # ------------------------------------------------------------------ iteration

    def __aiter__(self) -> "RayStream":
        return self

    async def __anext__(self) -> GenerationDelta:
        if not self._admitted:
            await self.admitted()
        while True:
            if self._error is not None:
                raise self._error
            if self._abort_cause is not None:
                return self._aborted()
            if self._closed:
                raise StopAsyncIteration
            try:
                item = await self._next_item()
            except asyncio.CancelledError:
                self._cancel("client")
                raise
            except StopAsyncIteration:
                raise self._fail(EngineDeadError(f"request {self.request_id}: the replica ended the stream "
                                                 f"without a result"))
            except Exception as exc:  # noqa: BLE001 - Ray's errors: see _ray_failure
                if self._abort_cause is not None:
                    continue  # the cancellation of an abort: the abort delta follows
                raise self._fail(_ray_failure(exc, self.request_id))
            if isinstance(item, GenerationDelta):
                self._saw(item)
                return item
            if item[0] == FINAL:
                delta, stats = item[1], item[2]
                self._saw(delta)
                self._closed = True
                self._record("finished", delta.finish_reason, stats)
                return delta
            raise self._fail(error_of(item))  # the request failed in the replica's engine

    async def aclose(self) -> None:
        """Stop reading: a request still running is aborted (its Ray call cancelled)."""
        self._cancel("client")
        self._closed = True

    def abort(self, cause: str, error: Optional[BaseException] = None) -> None:
        """End the request now (``cause`` as the engine's abort causes). The consumer then gets a final
        delta with finish_reason "abort", or ``error`` when one is given."""
        if self._closed or self._recorded or self._abort_cause is not None:
            return
        self._abort_cause = cause
        self._abort_error = error
        self._cancel(cause)

    # ------------------------------------------------------------------ helpers

    async def _next_item(self) -> Any:
        if self._deadline is None:
            return await self._response.__anext__()
        with anyio.CancelScope(deadline=self._deadline):
            return await self._response.__anext__()
        self._abort_cause = "deadline"  # only the deadline ends the scope without a return
        self._abort_error = RequestDeadlineExceeded(f"request {self.request_id} passed its deadline")
        self._cancel("deadline")
        raise self._abort_error

    def _saw(self, delta: GenerationDelta) -> None:
        if delta.token_ids and self._first_token_at is None:
            self._first_token_at = time.monotonic()
        self._num_output_tokens = delta.num_output_tokens
        self._num_cached_tokens = delta.num_cached_tokens

    def _aborted(self) -> GenerationDelta:
        self._closed = True
        if self._abort_error is not None:
            self._error = self._abort_error
            raise self._error
        self._error = StopAsyncIteration()  # the abort delta is the last
        return GenerationDelta(self.request_id, [], "", None, finish_reason="abort",
                               num_prompt_tokens=self.num_prompt_tokens, num_output_tokens=self._num_output_tokens,
                               num_cached_tokens=self._num_cached_tokens)

    def _cancel(self, cause: str) -> None:
        """Cancel the Ray call unless the request already ended, and record how it ended."""
        if not self._closed:
            try:
                self._response.cancel()
            except Exception:  # noqa: BLE001 - best effort: the replica's stall limit still ends it
                logger.exception("request %s: cancelling its Ray call failed", self.request_id)
        self._closed = True
        self._record("aborted", "abort", None, cause=cause)

    def _fail(self, exc: BaseException, refused: bool = False) -> BaseException:
        self._error = exc
        if not self._closed:
            self._closed = True
            try:
                self._response.cancel()
            except Exception:  # noqa: BLE001
                pass
        if refused:
            self._recorded = True  # never admitted: a refusal, counted as one (RayEngine._on_refused)
            self._engine._forget(self)
        else:
            self._record("error", None, None)
        return exc

    def _record(self, status: str, finish_reason: Optional[str], stats: Optional[RequestStats],
                cause: Optional[str] = None) -> None:
        if self._recorded:
            return
        self._recorded = True
        if stats is None:  # the replica's record did not come (aborted, failed): the ingress's view of it
            now = time.monotonic()
            first = self._first_token_at
            stats = RequestStats(
                request_id=self.request_id, status=status, finish_reason=finish_reason,
                abort_cause=(self._abort_cause or cause) if status == "aborted" else None,
                num_prompt_tokens=self.num_prompt_tokens, num_output_tokens=self._num_output_tokens,
                num_cached_tokens=self._num_cached_tokens, queue_time=None,
                ttft=None if first is None else first - self._arrival, e2e_latency=now - self._arrival,
                inter_token_latencies=(), num_preemptions=0, decode_time=None if first is None else now - first)
        self._engine._on_end(self, status, stats)


def _replica_gone(exc: BaseException) -> bool:
    """Whether a call failed because its replica's actor died or went away (safe to send elsewhere
    before the replica admitted the request: it never started)."""
    from ray.exceptions import RayActorError
    from ray.serve.exceptions import ReplicaUnavailableError

    cause = getattr(exc, "cause", None)
    return isinstance(exc, (RayActorError, ReplicaUnavailableError)) or isinstance(cause, RayActorError)


def _ray_failure(exc: BaseException, request_id: str) -> BaseException:
    """The engine error a failed Ray call stands for: Ray Serve's back-pressure is an overload (429),
    anything else (the replica died, the call was lost) ends the request as a dead engine would (503)."""
    from ray.serve.exceptions import BackPressureError

    if isinstance(exc, BackPressureError):
        return EngineOverloaded(f"request {request_id}: Ray Serve's queue for the engine replicas is full; "
                                f"retry later", retry_after=1.0)
    failure = EngineDeadError(f"request {request_id}: the engine replica serving it failed "
                              f"({type(exc).__name__}); retry the request")
    failure.__cause__ = exc
    return failure
