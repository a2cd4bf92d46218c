"""ASGI middleware: the app sees a request only once its body was read, whole and within the limit.

Why: an answer given before the body was read is lost. Quart's own limit (MAX_CONTENT_LENGTH)
answers 413 as soon as the declared length is too large, without reading the body; hypercorn
then closes the connection with the client's data still unread in the socket, and the kernel
turns that close into a TCP reset, which discards the 413 before the client read it. Clients
that finish writing before they read (httpx.AsyncClient, openai.AsyncOpenAI) saw a connection
error instead of the 413, and the openai client retried, sending the whole body again. The same
holds for any answer a route gives without reading its body (401, 404, 405, 415).

So every HTTP request's body is read here first and then replayed to the app unchanged
(the routes read whole bodies anyway, so this buffers nothing they would not). A body over the
limit, declared by Content-Length or counted (chunked), is read to its end and discarded; the
app then runs with an empty body and ``scope[BODY_ERROR] = "too_large"`` and answers 413 itself,
so that the error shape, metrics and logs are those of every other error. Reading is bounded:
past ``DRAIN_FACTOR`` times the limit, or after ``timeout`` seconds, the rest is left unread
(``"too_large"`` / ``"timeout"``) and the answer may be lost to the reset: that costs only a
client sending a huge or stalled body, never the server. Over HTTP/1, every answer to a request
flagged so carries ``Connection: close``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Optional

import anyio

BODY_ERROR = "aioinfer.body_error"  # scope key set for the app: "too_large" or "timeout"
TOO_LARGE = "too_large"
TIMEOUT = "timeout"
DRAIN_FACTOR = 4  # an over-limit body is read (and discarded) up to this many times the limit

Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
_EMPTY_BODY: Message = {"type": "http.request", "body": b"", "more_body": False}


class BodyLimit:
    """Wraps an ASGI app (Quart: ``app.asgi_app = BodyLimit(app.asgi_app, ...)``); non-HTTP scopes pass through."""

    def __init__(self, app, limit: int, timeout: Optional[float]) -> None:
        self.app = app
        self.limit = limit  # bytes a body may have
        self.drain_limit = limit * DRAIN_FACTOR  # bytes read at most before giving up on a body
        self.timeout = timeout  # seconds to receive a whole body; None: no bound

    async def __call__(self, scope: Message, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        body = await self._read(scope, receive)
        if body.disconnected:
            return  # the client left while sending: there is nobody to answer
        if body.error is not None:
            scope = {**scope, BODY_ERROR: body.error}
            if scope.get("http_version", "1.1") in ("1.0", "1.1"):  # HTTP/2 forbids connection headers
                send = _closing(send)
        await self.app(scope, body.replay(receive), send)

    async def _read(self, scope: Message, receive: Receive) -> "_Body":
        body = _Body()
        declared = _content_length(scope)
        if declared is not None and declared > self.drain_limit:
            body.error = TOO_LARGE  # not worth reading: answer at once
            return body
        with anyio.move_on_after(self.timeout):
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    body.disconnected = True
                    return body
                if message["type"] != "http.request":
                    continue
                body.add(message, self.limit)
                if not message.get("more_body", False):
                    body.complete = True
                    return body
                if body.size > self.drain_limit:
                    return body  # error is already TOO_LARGE
        body.error = body.error or TIMEOUT
        return body


@dataclass(slots=True)
class _Body:
    messages: list[Message] = field(default_factory=list)  # the http.request messages kept for the app
    size: int = 0  # bytes received so far
    complete: bool = False  # the last message (more_body false) was read
    disconnected: bool = False  # the client disconnected before the body ended
    error: Optional[str] = None  # TOO_LARGE or TIMEOUT; the app then gets an empty body

    def add(self, message: Message, limit: int) -> None:
        self.size += len(message.get("body", b""))
        if self.size > limit:
            self.error = TOO_LARGE
            self.messages.clear()  # discarded: never handed to the app
        elif self.error is None:
            self.messages.append(message)

    def replay(self, receive: Receive) -> Receive:
        pending = deque(self.messages if self.error is None else [_EMPTY_BODY])
        complete = self.complete

        async def replayed() -> Message:
            if pending:
                return pending.popleft()
            if complete:
                return await receive()  # only http.disconnect is left to come
            # The rest of the body stays unread; the connection closes after the answer.
            await anyio.sleep_forever()
            raise AssertionError("unreachable")

        return replayed


def _closing(send: Send) -> Send:
    async def send_closing(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = [(k, v) for k, v in message.get("headers", ()) if k.lower() != b"connection"]
            message = {**message, "headers": [*headers, (b"connection", b"close")]}
        await send(message)

    return send_closing


def _content_length(scope: Message) -> Optional[int]:
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the server (h11) rejects malformed lengths before the app sees them
    return None
