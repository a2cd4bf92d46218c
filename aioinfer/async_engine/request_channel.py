"""Per-request delivery: a bounded memory-object stream, one merged overflow slot and a wake-up event.

The producer (the engine's dispatcher, on the event loop) never waits: when the stream's buffer
is full, new deltas are merged into ``pending`` instead of being dropped, and ``pending`` moves
into the stream as soon as the consumer makes room. A consumer that has taken nothing for longer
than the stall limit while deltas waited for it (``unread_since``, counted from the first delta it
has not taken, not from the moment the buffer filled) is cut off by the engine. A consumer that
relays the deltas further (an HTTP response) can hand in ``stall_probe``: since when its own
recipient has taken nothing while data waited, which the engine's watchdog counts the same way.

The consumer (``iterate_deltas``, the iterator ``Engine.generate`` returns) does not park in the
stream's ``receive()``: with hundreds of streams that one call was half of the event loop's time
per token (a checkpoint, a task-info record and an event per call). It takes buffered deltas with
``receive_nowait`` (``queued`` says how many, so an empty stream costs no exception) and, when
there are none, waits on ``waiter``, a plain event that the producer sets when it sends or closes.
The stream stays the bounded buffer and the close signal.

Stream interval (``interval``, vLLM's ``--stream-interval``): deltas are held (merged in
``pending``, not yet for reading) until they carry ``interval`` tokens, so that under load one
wake-up, one SSE event and one socket write serve several tokens. The first tokens and the last
delta go at once; 1 (the default) sends every delta as it comes.

Final-only delivery (``final_only``, vLLM's ``RequestOutputKind.FINAL_ONLY``): every delta is
merged into ``pending`` and nothing is sent, so the consumer sleeps until the request ends and then
wakes once for the one merged delta.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Optional

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from aioinfer.engine.delta import DeltaMerger, GenerationDelta
from aioinfer.errors import EngineDeadError, RequestDeadlineExceeded

logger = logging.getLogger(__name__)


@dataclass(slots=True, eq=False)
class RequestChannel:
    request_id: str
    num_prompt_tokens: int
    send: MemoryObjectSendStream
    receive: MemoryObjectReceiveStream
    arrival: float  # time.monotonic() when accepted
    final_only: bool = False  # deliver one merged delta when the request ends (non-streaming)
    interval: int = 1  # tokens a delta holds before it is for reading (the first and the last: at once)
    queued: int = 0  # deltas in the stream's buffer, not yet taken by the consumer
    pending: Optional[DeltaMerger] = None  # merged deltas the buffer had no room for (final-only: all so far)
    waiter: Any = None  # an anyio Event the consumer waits on while ``queued`` is 0; set once, then dropped
    error: Optional[BaseException] = None  # raised to the consumer once the buffer is drained
    closed: bool = False  # no more deltas will come (finished, aborted or failed)
    waiting_admission: bool = True  # counted against the admission bounds until its first step
    unread_since: Optional[float] = None  # time.monotonic() of the oldest delta not taken yet (stall detection)
    # Relays (an HTTP response): stall_probe(now) -> since when the relay's recipient took nothing
    # while data waited for it (time.monotonic()), or None when it is keeping up.
    stall_probe: Optional[Callable[[float], Optional[float]]] = None
    # timings for RequestStats
    scheduled_at: Optional[float] = None
    first_token_at: Optional[float] = None
    last_token_at: Optional[float] = None
    inter_token: list[float] = field(default_factory=list)
    num_output_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    num_preemptions: int = 0
    abort_cause: Optional[str] = None

    @classmethod
    def open(cls, request_id: str, num_prompt_tokens: int, buffer_size: int, final_only: bool = False,
             stall_probe: Optional[Callable[[float], Optional[float]]] = None, interval: int = 1) -> "RequestChannel":
        send, receive = anyio.create_memory_object_stream[object](max_buffer_size=buffer_size)
        return cls(request_id=request_id, num_prompt_tokens=num_prompt_tokens, send=send, receive=receive,
                   arrival=time.monotonic(), final_only=final_only, stall_probe=stall_probe, interval=interval)

    def deliver(self, delta: GenerationDelta, now: float) -> None:
        """Never blocks: appends to the stream, or merges into ``pending`` when the buffer is full
        (or while the stream interval holds it; final-only: until the request ends). ``now``:
        time.monotonic(), once per step."""
        if self.closed:
            return
        if delta.token_ids:
            if self.first_token_at is None:
                self.first_token_at = now
            elif self.last_token_at is not None:
                self.inter_token.append(now - self.last_token_at)
            self.last_token_at = now
        self.num_output_tokens = delta.num_output_tokens
        self.num_cached_tokens = delta.num_cached_tokens
        pending = self.pending
        if pending is not None:
            pending.add(delta)
            self.flush(now)  # if it is ready now (and there is room)
        elif self._holds(delta):
            self.pending = DeltaMerger(delta)  # not for reading yet: the stall clock does not start
        else:
            if self.unread_since is None:
                self.unread_since = now
            try:
                self.send.send_nowait(delta)
            except anyio.WouldBlock:
                self.pending = DeltaMerger(delta)
            else:
                self.queued += 1
                self._wake()
        if delta.finish_reason is not None:
            self._close_when_drained()

    def _holds(self, delta: GenerationDelta) -> bool:
        """Whether a delta arriving with nothing pending waits for more (final-only, stream interval)."""
        if delta.finish_reason is not None:
            return False
        if self.final_only:
            return True
        interval = self.interval
        # The first tokens go at once (time to first token is not the interval's to stretch).
        return (interval > 1 and len(delta.token_ids) < interval
                and delta.num_output_tokens > len(delta.token_ids))

    def take(self) -> GenerationDelta:
        """The consumer's read (``queued`` > 0): every buffered delta, merged into one; then
        ``pending`` moves into the room this made."""
        count, self.queued = self.queued, 0
        receive_nowait = self.receive.receive_nowait
        item = receive_nowait()
        if count > 1:  # a consumer that fell behind catches up in one wake-up instead of one per step
            merger = DeltaMerger(item)
            for _ in range(count - 1):
                merger.add(receive_nowait())
            item = merger.result()
        self.unread_since = None
        if self.pending is not None:
            self.flush()  # what overflowed moves into the room made: unread again from this read on
        return item

    def flush(self, now: Optional[float] = None) -> None:
        """Move ``pending`` into the stream if it is ready (final-only: once final; otherwise once it
        holds ``interval`` tokens, or is final) and there is room now."""
        pending = self.pending
        if pending is None:
            return
        if not pending.finished and (self.final_only or pending.num_tokens < self.interval):
            return
        if self.unread_since is None and not self.final_only:
            self.unread_since = time.monotonic() if now is None else now
        try:
            self.send.send_nowait(pending.result())
        except (anyio.WouldBlock, anyio.ClosedResourceError, anyio.BrokenResourceError):
            return
        self.queued += 1
        self.pending = None
        if self.closed:
            self.send.close()
        self._wake()

    def fail(self, error: BaseException) -> None:
        """End the stream with an error (after what is already buffered)."""
        if self.error is None:
            self.error = error
        self.pending = None
        self.closed = True
        self.send.close()
        self._wake()

    def stalled_for(self, now: float) -> float:
        """Seconds the consumer has taken nothing while deltas waited for it: since the oldest delta it
        has not taken, or, for a relay, since its recipient last took data (``stall_probe``)."""
        since = self.unread_since
        probe = self.stall_probe
        if probe is not None:
            try:
                relayed = probe(now)
            except Exception:  # noqa: BLE001 - a relay's probe is information: a failing one gives none
                # The engine's watchdog calls this; an error escaping it would end the engine and
                # every request with it. The probe is dropped (it would fail again), and the limit
                # at the consumer still holds.
                logger.exception("request %s: the stall probe failed; its relay is no longer watched",
                                 self.request_id)
                self.stall_probe = relayed = None
            if relayed is not None and (since is None or relayed < since):
                since = relayed
        return 0.0 if since is None else now - since

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            waiter.set()

    def _close_when_drained(self) -> None:
        self.closed = True
        if self.pending is None:
            self.send.close()
        self._wake()


async def iterate_deltas(channel: RequestChannel, deadline: Optional[float], new_event: Callable[[], Any],
                         abort_channel: Callable[..., None]) -> AsyncIterator[GenerationDelta]:
    """The consumer side of one request: what ``Engine.generate`` returns.

    ``new_event``: the engine's ``event_factory()`` maker; ``abort_channel(channel, cause,
    notify=False)``: the engine's abort, called when the consumer leaves before the final delta.
    """
    finished = False
    try:
        while True:
            if deadline is not None and anyio.current_time() >= deadline:
                channel.abort_cause = "deadline"
                raise RequestDeadlineExceeded(f"request {channel.request_id} passed its deadline")
            if not channel.queued:
                if channel.closed:  # ended without a final delta: failed, or aborted without notice
                    finished = True
                    raise channel.error or EngineDeadError("the request's stream ended without a result")
                # Wait for the producer's next send or close; take nothing before checking again.
                waiter = channel.waiter = new_event()
                if deadline is None:
                    await waiter.wait()
                else:
                    await _wait_until(channel, waiter, deadline)
                continue
            # Everything buffered, merged into one delta, without a checkpoint: a consumer that fell
            # behind (a busy loop, a slow client) catches up in one wake-up instead of one per step.
            item = channel.take()
            finished = item.finish_reason is not None
            yield item
            if finished:
                return
    finally:
        if not finished:
            # Cancelled, broken out of, or past its deadline: free its KV at the next step boundary.
            abort_channel(channel, channel.abort_cause or "client", notify=False)
        channel.receive.close()


async def _wait_until(channel: RequestChannel, waiter, deadline: float) -> None:
    """Wait for ``waiter``; raises RequestDeadlineExceeded past ``deadline``."""
    with anyio.CancelScope(deadline=deadline):
        await waiter.wait()
        return
    # Only the deadline ends the scope without a return (an outer cancellation propagates).
    channel.abort_cause = "deadline"
    raise RequestDeadlineExceeded(f"request {channel.request_id} passed its deadline")


def event_factory() -> Callable[[], Any]:
    """A maker of one-shot wake-up events (``set()``, ``await wait()``) for the running loop (call on it).

    The consumer makes one per wait, so this is on the per-token path. On asyncio it is a bare
    future: ``anyio.Event`` wraps an ``asyncio.Event`` that wraps a future (two more coroutine frames
    per wake-up) and looks the backend up on every construction. Cancellation is unchanged: anyio's
    cancel scopes cancel the task, which cancels the awaited future. Elsewhere (trio) an anyio Event.
    """
    import asyncio

    import anyio.lowlevel

    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return anyio.Event  # trio
    current_token = getattr(anyio.lowlevel, "current_token", None)  # anyio >= 4.11
    token = current_token() if current_token is not None else loop
    if getattr(token, "native_token", token) is not loop:  # e.g. trio in guest mode on an asyncio loop
        return anyio.Event
    create_future = loop.create_future

    def make() -> _FutureEvent:
        return _FutureEvent(create_future())

    return make


class _FutureEvent:
    __slots__ = ("_future",)

    def __init__(self, future) -> None:
        self._future = future

    def set(self) -> None:
        if not self._future.done():  # a cancelled wait leaves a cancelled future behind
            self._future.set_result(None)

    def is_set(self) -> bool:
        return self._future.done() and not self._future.cancelled()

    def wait(self):
        return self._future  # awaitable: ``await event.wait()``
