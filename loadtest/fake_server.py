"""A tiny fake OpenAI-compatible streaming server, to smoke-test the load generator itself.

    python -m loadtest.fake_server --port 8100 --ttft 0.05 --itl 0.01 --max-running 32

Streams ``max_tokens`` one-word chunks for /v1/completions and /v1/chat/completions, then a usage
chunk and ``data: [DONE]``; above ``--max-running`` concurrent requests it answers 429 with
Retry-After. Plain anyio TCP with HTTP/1.1 keep-alive and chunked encoding: no web framework.
"""

from __future__ import annotations

import argparse
import json

import anyio
from anyio.abc import SocketStream


class FakeServer:
    def __init__(self, ttft: float, itl: float, max_running: int) -> None:
        self.ttft, self.itl, self.max_running = ttft, itl, max_running
        self.running = 0

    async def handle(self, conn: SocketStream) -> None:
        buf = b""
        async with conn:
            try:
                while True:
                    while b"\r\n\r\n" not in buf:
                        buf += await conn.receive()
                    head, buf = buf.split(b"\r\n\r\n", 1)
                    lines = head.decode("latin-1").split("\r\n")
                    path = lines[0].split(" ")[1]
                    headers = {k.strip().lower(): v.strip() for k, v in
                               (ln.split(":", 1) for ln in lines[1:] if ":" in ln)}
                    n = int(headers.get("content-length", "0"))
                    while len(buf) < n:
                        buf += await conn.receive()
                    body, buf = buf[:n], buf[n:]
                    await self.respond(conn, path, json.loads(body or b"{}"))
            except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
                return

    async def respond(self, conn: SocketStream, path: str, req: dict) -> None:
        if self.running >= self.max_running:
            msg = b'{"error": {"message": "overloaded", "code": 429}}'
            await conn.send(b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 0.05\r\n"
                            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                            % (len(msg), msg))
            return
        self.running += 1
        try:
            await conn.send(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                            b"Transfer-Encoding: chunked\r\n\r\n")
            chat = path.endswith("/chat/completions")
            n = int(req.get("max_tokens") or 16)
            await anyio.sleep(self.ttft)
            for i in range(n):
                if i:
                    await anyio.sleep(self.itl)
                choice = {"index": 0, "delta": {"content": " tok"}} if chat else {"index": 0, "text": " tok"}
                await self.event(conn, {"choices": [choice]})
            prompt = req.get("prompt")
            usage = {"prompt_tokens": len(prompt) if isinstance(prompt, list) else 0,
                     "completion_tokens": n}
            await self.event(conn, {"choices": [], "usage": usage})
            await self.send_chunk(conn, b"data: [DONE]\n\n")
            await self.send_chunk(conn, b"")
        finally:
            self.running -= 1

    async def event(self, conn: SocketStream, obj: dict) -> None:
        await self.send_chunk(conn, b"data: " + json.dumps(obj).encode() + b"\n\n")

    @staticmethod
    async def send_chunk(conn: SocketStream, data: bytes) -> None:
        await conn.send(b"%x\r\n%s\r\n" % (len(data), data))


async def serve(port: int, server: FakeServer) -> None:
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=port)
    await listener.serve(server.handle)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--port", type=int, default=8100)
    p.add_argument("--ttft", type=float, default=0.05, help="s before the first chunk")
    p.add_argument("--itl", type=float, default=0.01, help="s between chunks")
    p.add_argument("--max-running", type=int, default=1 << 30, help="429 above this many")
    a = p.parse_args()
    try:
        anyio.run(serve, a.port, FakeServer(a.ttft, a.itl, a.max_running))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
