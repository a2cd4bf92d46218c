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


def json_response(obj: Any, status: int = 200, headers: Optional[dict[str, str]] = None) -> Response:
    return Response(dumps(obj), status=status, headers=headers, content_type="application/json")


def sse_response(body: AsyncIterator[bytes], headers: Optional[dict[str, str]] = None) -> Response:
    response = Response(body, status=200, headers={**_SSE_HEADERS, **(headers or {})},
                        content_type="text/event-stream; charset=utf-8")
    response.timeout = None  # a stream lasts as long as generation does (Quart's default is 60 s)
    return response
