"""The end of a graceful shutdown: requests still open are aborted and their responses end well.

Hypercorn (both ``hypercorn aioinfer.app:app`` and ``python -m aioinfer serve``) gives in-flight
requests its graceful timeout, then cancels their ASGI tasks. Cancelled as they are, a
non-streaming response that had not started becomes hypercorn's empty 500, a stream is cut
mid-event, and Quart's orphaned handler later writes into the closed stream
(``UnexpectedMessageError`` tracebacks). ``EndOpenResponses`` wraps the app: it runs each HTTP
request in a task of its own, and when the server cancels the request it aborts the request's
engine work (cause "shutdown") and gives the response ``FLUSH_SECONDS`` to finish before passing
the cancellation on. A stream then ends with a final chunk per choice (``finish_reason: "abort"``)
and ``[DONE]``; a non-streaming request gets a 503 ``shutting_down`` error (clients retry 503s,
elsewhere) instead of a truncated answer that looks complete.

Hypercorn cancels a request's task only there: a client disconnect reaches the app as
``http.disconnect`` (Quart cancels its own handler), not as a cancellation of this task.

Whatever way an HTTP exchange ends, the engine work it admitted ends with it (``release``): a
request must never outlive its connection, which is what a response the ASGI server could not
start (a 500 after the handler returned) otherwise left running.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import Any, Callable

logger = logging.getLogger("aioinfer.server")

FLUSH_SECONDS = 5.0  # after the abort: time for final events to reach the socket
SCOPE_KEY = "aioinfer.responses"  # the request's ResponseSlot in the ASGI scope


class ResponseSlot:
    """The engine work of one HTTP request (its ChoiceStreams), as the shutdown needs to find it."""

    __slots__ = ("streams", "cancelled")

    def __init__(self) -> None:
        self.streams: list[Any] = []  # ChoiceStreams admitted for this request
        self.cancelled = False  # the server is cancelling this request: admit nothing more

    async def end_for_shutdown(self) -> None:
        self.cancelled = True
        for streams in self.streams:
            await streams.abort_for_shutdown()

    async def release(self) -> None:
        """The HTTP exchange is over, however it ended: abort whatever engine work it still holds.

        A response that ends normally has closed its streams already (aborting again costs a lookup).
        This is for the ways no handler's ``finally`` sees: the server failed to send the response's
        head (a 500 from the ASGI server after the handler returned), or the body was never iterated.
        Without it such requests ran on for a connection that was gone."""
        for streams in self.streams:
            await streams.close()
        self.streams.clear()


class OpenResponses:
    """The HTTP requests in flight (one ``ResponseSlot`` each), for the server's shutdown to end."""

    def __init__(self) -> None:
        self._slots: set[ResponseSlot] = set()
        self._idle = asyncio.Event()
        self._idle.set()

    def __len__(self) -> int:
        return len(self._slots)

    def open(self) -> ResponseSlot:
        slot = ResponseSlot()
        self._slots.add(slot)
        self._idle.clear()
        return slot

    def close(self, slot: ResponseSlot) -> None:
        self._slots.discard(slot)
        if not self._slots:
            self._idle.set()

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until no request is in flight; False if some still are after ``timeout`` seconds."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True

    async def end_all(self) -> None:
        """Abort the engine work of every request in flight: each response ends at once, and well."""
        for slot in list(self._slots):
            await slot.end_for_shutdown()


class EndOpenResponses:
    """ASGI middleware (installed as the Quart app's ``asgi_app``); see the module docstring."""

    def __init__(self, app: Callable, responses: OpenResponses) -> None:
        self.app = app
        self.responses = responses

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        slot = scope[SCOPE_KEY] = self.responses.open()
        inner = asyncio.ensure_future(self.app(scope, receive, send))
        try:
            await asyncio.shield(inner)
        except asyncio.CancelledError:
            if inner.done():
                raise
            await self._end(slot, inner)
            raise
        finally:
            self.responses.close(slot)
            await slot.release()  # never suspends (the engine's abort only posts): safe while cancelled

    @staticmethod
    async def _end(slot: ResponseSlot, inner: asyncio.Future) -> None:
        try:
            await slot.end_for_shutdown()
            await asyncio.wait_for(asyncio.shield(inner), FLUSH_SECONDS)
        except asyncio.TimeoutError:
            logger.warning("a response did not end within %g s of its shutdown abort; cut", FLUSH_SECONDS)
        except Exception:  # noqa: BLE001 - Quart answers a handler's errors itself; this would be its own
            logger.exception("a request failed while its response was ending for the shutdown")
        finally:
            if not inner.done():
                inner.cancel()
                await asyncio.gather(inner, return_exceptions=True)


async def end_after_grace(responses: OpenResponses, grace: float) -> None:
    """``python -m aioinfer serve`` on SIGTERM: requests in flight get ``grace`` seconds, then end (aborted).

    Ending them before hypercorn's own graceful timeout (set longer) lets their connections close
    normally, so hypercorn never has to cancel them (Python 3.11's asyncio logs a traceback for every
    connection task cancelled so).
    """
    if not await responses.wait_idle(grace):
        logger.info("shutdown: %d requests still open after %g s; aborting them", len(responses), grace)
        await responses.end_all()


def slot_of(scope: dict) -> ResponseSlot | None:
    return scope.get(SCOPE_KEY)


def quiet_cancelled_connection_tasks(loop: asyncio.AbstractEventLoop) -> None:
    """Drop the one traceback Python 3.11's asyncio logs for each connection task a server cancels.

    ``asyncio.start_server``'s done-callback calls ``task.exception()`` without checking
    ``task.cancelled()`` first (3.12 checks), so every connection still open when hypercorn's
    graceful timeout cancels it logs "Exception in callback StreamReaderProtocol...": noise, not a
    failure (the response was ended above). Everything else goes to the handler that was there.
    """
    if sys.version_info >= (3, 12):
        return
    previous = loop.get_exception_handler()

    def handler(loop: asyncio.AbstractEventLoop, context: dict) -> None:
        if isinstance(context.get("exception"), asyncio.CancelledError) and \
                "StreamReaderProtocol.connection_made" in repr(context.get("handle")):
            return
        if previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handler)
