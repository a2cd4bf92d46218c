"""Per-request delivery: a bounded memory-object stream plus one merged overflow slot.

The producer (the engine's dispatcher, on the event loop) never waits: when the stream's buffer
is full, new deltas are merged into ``pending`` instead of being dropped, and ``pending`` moves
into the stream as soon as the consumer makes room. A consumer that leaves ``pending`` waiting
for longer than the stall limit is cut off by the engine.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from aioinfer.engine.delta import GenerationDelta


@dataclass(slots=True, eq=False)
class RequestChannel:
    request_id: str
    num_prompt_tokens: int
    send: MemoryObjectSendStream
    receive: MemoryObjectReceiveStream
    arrival: float  # time.monotonic() when accepted
    pending: Optional[GenerationDelta] = None  # merged deltas the buffer had no room for
    error: Optional[BaseException] = None  # raised to the consumer once the buffer is drained
    closed: bool = False  # no more deltas will come (finished, aborted or failed)
    waiting_admission: bool = True  # counted against the admission bounds until its first step
    last_read: float = 0.0  # time.monotonic() of the consumer's last receive
    overflow_since: Optional[float] = None  # when pending was first needed (stall detection)
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
    def open(cls, request_id: str, num_prompt_tokens: int, buffer_size: int) -> "RequestChannel":
        send, receive = anyio.create_memory_object_stream[object](max_buffer_size=buffer_size)
        now = time.monotonic()
        return cls(request_id=request_id, num_prompt_tokens=num_prompt_tokens, send=send, receive=receive,
                   arrival=now, last_read=now)

    def deliver(self, delta: GenerationDelta) -> None:
        """Never blocks: appends to the stream, or merges into ``pending`` when the buffer is full."""
        if self.closed:
            return
        now = time.monotonic()
        if delta.token_ids:
            if self.first_token_at is None:
                self.first_token_at = now
            elif self.last_token_at is not None:
                self.inter_token.append(now - self.last_token_at)
            self.last_token_at = now
        self.num_output_tokens = delta.num_output_tokens
        self.num_cached_tokens = delta.num_cached_tokens
        if self.pending is not None:
            self.pending.merge(delta)
        else:
            try:
                self.send.send_nowait(delta)
            except anyio.WouldBlock:
                self.pending = delta
                self.overflow_since = now
        if delta.finished:
            self._close_when_drained()

    def flush(self) -> None:
        """Move ``pending`` into the stream if there is room now (called after each consumer read)."""
        if self.pending is None:
            return
        try:
            self.send.send_nowait(self.pending)
        except (anyio.WouldBlock, anyio.ClosedResourceError, anyio.BrokenResourceError):
            return
        self.pending = None
        self.overflow_since = None
        if self.closed:
            self.send.close()

    def fail(self, error: BaseException) -> None:
        """End the stream with an error (after what is already buffered)."""
        if self.error is None:
            self.error = error
        self.pending = None
        self.closed = True
        self.send.close()

    def stalled_for(self, now: float) -> float:
        """Seconds the consumer has left merged deltas waiting without reading anything."""
        if self.pending is None or self.overflow_since is None:
            return 0.0
        return now - max(self.overflow_since, self.last_read)

    def _close_when_drained(self) -> None:
        self.closed = True
        if self.pending is None:
            self.send.close()
