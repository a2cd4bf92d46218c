"""BodyLimit's bounds, driven with scripted ASGI messages (the real-server path is in test_server_http_edge.py).

No test here depends on timing: a receive that never returns stands for a stalled client, and a
zero timeout gives up at its first wait whatever the machine's speed.
"""

from __future__ import annotations

import anyio
import pytest

from aioinfer.entrypoints.openai.body_limit import BODY_ERROR, DRAIN_FACTOR, TIMEOUT, TOO_LARGE, BodyLimit

LIMIT = 100


class Script:
    """A client: its body messages in order, then (optionally) nothing ever again."""

    def __init__(self, chunks: list[bytes], ends: bool = True) -> None:
        self.messages = [{"type": "http.request", "body": c, "more_body": True} for c in chunks]
        if ends:
            self.messages.append({"type": "http.request", "body": b"", "more_body": False})
        self.read = 0  # messages taken by the middleware or the app

    async def receive(self):
        if self.read < len(self.messages):
            self.read += 1
            return self.messages[self.read - 1]
        await anyio.sleep_forever()


class App:
    """Records what it was given and answers 200 after reading its body."""

    def __init__(self) -> None:
        self.scope = None
        self.body = b""
        self.sent: list[dict] = []

    async def __call__(self, scope, receive, send):
        self.scope = scope
        while True:
            message = await receive()
            self.body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        await send({"type": "http.response.start", "status": 200, "headers": [(b"connection", b"keep-alive")]})
        await send({"type": "http.response.body", "body": b"ok", "more_body": False})


def scope(content_length=None):
    headers = [] if content_length is None else [(b"content-length", str(content_length).encode())]
    return {"type": "http", "method": "POST", "path": "/", "headers": headers}


def run(client: Script, content_length=None, timeout=10.0) -> App:
    app, sent = App(), []

    async def send(message):
        sent.append(message)

    anyio.run(BodyLimit(app, LIMIT, timeout), scope(content_length), client.receive, send)
    app.sent = sent
    return app


def headers(app: App) -> dict[bytes, bytes]:
    return dict(app.sent[0]["headers"])


def test_within_the_limit_the_body_is_replayed_unchanged():
    app = run(Script([b"a" * 60, b"b" * 40]))
    assert app.body == b"a" * 60 + b"b" * 40 and BODY_ERROR not in app.scope
    assert headers(app)[b"connection"] == b"keep-alive"


@pytest.mark.parametrize("declared", [None, 3 * LIMIT])
def test_over_the_limit_the_whole_body_is_read_then_flagged(declared):
    client = Script([b"a" * LIMIT] * 3)
    app = run(client, content_length=declared)
    assert client.read == len(client.messages)  # drained to the end: nothing left unread in the socket
    assert app.scope[BODY_ERROR] == TOO_LARGE and app.body == b""  # the app never sees the oversized bytes
    assert headers(app)[b"connection"] == b"close"


def test_a_body_declared_beyond_the_drain_bound_is_not_read():
    client = Script([b"a" * LIMIT] * (DRAIN_FACTOR + 2))
    app = run(client, content_length=LIMIT * (DRAIN_FACTOR + 2))
    assert client.read == 0 and app.scope[BODY_ERROR] == TOO_LARGE
    assert headers(app)[b"connection"] == b"close"


def test_a_chunked_body_is_read_only_up_to_the_drain_bound():
    client = Script([b"a" * LIMIT] * (DRAIN_FACTOR * 3))
    app = run(client)
    assert client.read == DRAIN_FACTOR + 1  # the first message past the bound stops the reading
    assert app.scope[BODY_ERROR] == TOO_LARGE


def test_a_stalled_body_times_out():
    client = Script([b"a" * 10], ends=False)
    app = run(client, timeout=0)
    assert app.scope[BODY_ERROR] == TIMEOUT and app.body == b""
    assert headers(app)[b"connection"] == b"close"


def test_a_client_gone_mid_body_is_not_answered():
    client = Script([b"a" * 10], ends=False)
    client.messages.append({"type": "http.disconnect"})
    app = run(client)
    assert app.scope is None and app.sent == []


def test_other_scopes_pass_through():
    seen = []

    async def app(scope, receive, send):
        seen.append(scope["type"])

    async def never():
        raise AssertionError("BodyLimit must not read a lifespan scope")

    anyio.run(BodyLimit(app, LIMIT, 1.0), {"type": "lifespan"}, never, None)
    assert seen == ["lifespan"]
