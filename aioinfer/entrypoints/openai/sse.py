"""JSON and server-sent-event responses (orjson-encoded).

Stream framing: one ``data: {json}\\n\\n`` event per chunk and ``data: [DONE]\\n\\n`` at the end.
An error after the stream started is an event ``data: {"error": {...}}`` followed by ``[DONE]``
(vLLM's behaviour: clients that read until [DONE] still terminate; the openai client raises on
the error event).
"""

from __future__ import annotations

from typing import Any, AsyncIterator, Optional

import orjson
from quart import Response

DONE = b"data: [DONE]\n\n"
_SSE_HEADERS = {
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",  # nginx: do not buffer the stream
}


def dumps(obj: Any) -> bytes:
    return orjson.dumps(obj, option=orjson.OPT_NON_STR_KEYS)


def event(obj: Any) -> bytes:
    return b"data: " + dumps(obj) + b"\n\n"


_MARK = "\x00aioinfer-text\x00"  # stands for the one string an event template leaves open
_MARK_JSON = orjson.dumps(_MARK)


class EventTemplate:
    """An SSE event whose JSON is fixed except for one string, encoded once: ``fill(text)`` is then
    two concatenations and one string encoding instead of building and encoding the whole object.

    A stream's chunks differ from one another only in their text (id, object, created, model, the
    choice's index and null fields repeat), and they are the per-token path of every streaming
    response. The bytes are exactly ``event(obj)`` with the text in place of the marker.
    """

    __slots__ = ("_head", "_tail")

    def __init__(self, obj: Any) -> None:
        encoded = event(obj)
        head, found, tail = encoded.partition(_MARK_JSON)
        if not found or _MARK_JSON in tail:
            raise ValueError("an event template needs the marker exactly once")
        self._head, self._tail = head, tail

    def fill(self, text: str) -> bytes:
        return self._head + dumps(text) + self._tail


def text_marker() -> str:
    """The placeholder an ``EventTemplate`` object carries where its text goes."""
    return _MARK


def json_response(obj: Any, status: int = 200, headers: Optional[dict[str, str]] = None) -> Response:
    return Response(dumps(obj), status=status, headers=headers, content_type="application/json")


def sse_response(body: AsyncIterator[bytes], headers: Optional[dict[str, str]] = None) -> Response:
    response = Response(body, status=200, headers={**_SSE_HEADERS, **(headers or {})},
                        content_type="text/event-stream; charset=utf-8")
    response.timeout = None  # a stream lasts as long as generation does (Quart's default is 60 s)
    return response
