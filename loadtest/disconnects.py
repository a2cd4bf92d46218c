"""Clients that leave badly: streams cut at random points, by FIN or RST, after a stall or not.

A server must outlive every client. This drives one with many streaming clients that each send a
request (completions or chat, some JSON-schema constrained, some with ``n`` > 1), read a random
number of bytes of the response (none, part of the head, part of the stream, or all of it), then
may stop reading for a while with a small receive buffer (a stalled reader: the server's send
queue fills and its window stops moving), and finally close: a FIN, a half-close, or an RST
(``SO_LINGER`` 0). While they run, ``/health`` is polled; afterwards a normal request must
complete and ``/health`` must answer 200. Exit status 0 only if the server stayed healthy.

    python -m loadtest.disconnects --url http://127.0.0.1:8000 --clients 1000 --concurrency 64

The summary is the last line on stdout (JSON); ``--out FILE`` keeps it. Plain asyncio sockets,
not an HTTP client: a client library would read, buffer and close in its own way, and the point
here is to control exactly when the client stops reading and how it hangs up.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import socket
import struct
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Optional
from urllib.parse import urlsplit

import httpx

_WORDS = ("river stone cloud engine garden silver window market candle forest ladder "
          "orange signal harbor pencil thunder meadow rocket velvet lantern").split()
_SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                            "count": {"type": "integer"}, "tags": {"type": "array",
                                                                                  "items": {"type": "string"}}},
           "required": ["name", "count"]}
_CLOSES = ("fin", "rst", "half")  # close(); SO_LINGER 0 then close() (an RST); shutdown(SHUT_WR) then close()


@dataclass(frozen=True, slots=True)
class ClientPlan:
    route: str  # "completions" or "chat"
    constrained: bool  # a JSON-schema response_format (chat) / structured_outputs json (completions)
    n: int  # choices
    max_tokens: int
    read_bytes: int  # bytes of the response (head included) read before stopping; -1: to the end
    stall: float  # seconds without reading before the close (0: none)
    rcvbuf: int  # the client's SO_RCVBUF (small: a stalled reader's window closes soon)
    close: str  # one of _CLOSES
    prompt: str


@dataclass(slots=True)
class Summary:
    clients: int = 0
    completed: int = 0  # read to the end of the stream ([DONE])
    cut: dict = field(default_factory=dict)  # close kind -> clients that hung up before the end
    refused: dict = field(default_factory=dict)  # HTTP status (not 200) -> count, e.g. 429 under load
    client_errors: dict = field(default_factory=dict)  # the client's own failures (connect refused, ...)
    health_samples: int = 0
    health_failures: int = 0  # /health answered, and not 200, while the clients ran
    health_timeouts: int = 0  # /health did not answer within 10 s (a busy host; not a failure by itself)
    final_ok: bool = False  # a normal request completed after the run, and /health said 200
    final_detail: str = ""
    seconds: float = 0.0


def plan_clients(count: int, seed: int, constrained_share: float, stall_share: float,
                 max_stall: float) -> list[ClientPlan]:
    """Deterministic plans: the same seed gives the same clients (a failure can be replayed)."""
    rng = random.Random(seed)
    plans = []
    for _ in range(count):
        whole = rng.random() < 0.1
        plans.append(ClientPlan(
            route=rng.choice(("completions", "chat")), constrained=rng.random() < constrained_share,
            n=rng.choice((1, 1, 1, 2)), max_tokens=rng.randint(8, 64),
            read_bytes=-1 if whole else rng.choice((0, rng.randint(1, 400), rng.randint(400, 12000))),
            stall=rng.uniform(0.05, max_stall) if rng.random() < stall_share else 0.0,
            rcvbuf=rng.choice((1024, 4096, 65536)), close=rng.choice(_CLOSES),
            prompt=" ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 40)))))
    return plans


def request_bytes(plan: ClientPlan, host: str, model: Optional[str]) -> bytes:
    body: dict = {"max_tokens": plan.max_tokens, "stream": True, "n": plan.n, "temperature": 0.8}
    if model:
        body["model"] = model
    if plan.route == "chat":
        path = "/v1/chat/completions"
        body["messages"] = [{"role": "user", "content": plan.prompt}]
        if plan.constrained:
            body["response_format"] = {"type": "json_schema", "json_schema": {"name": "item", "schema": _SCHEMA}}
    else:
        path = "/v1/completions"
        body["prompt"] = plan.prompt
        if plan.constrained:
            body["structured_outputs"] = {"json": _SCHEMA}
    payload = json.dumps(body).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\nAccept: text/event-stream\r\n\r\n")
    return head.encode() + payload


async def run_client(plan: ClientPlan, host: str, port: int, model: Optional[str], summary: Summary,
                     timeout: float) -> None:
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, plan.rcvbuf)  # before connect: sets the window scale
    sock.setblocking(False)
    ended = False
    try:
        await asyncio.wait_for(loop.sock_connect(sock, (host, port)), timeout)
        await loop.sock_sendall(sock, request_bytes(plan, host, model))
        received = b""
        while plan.read_bytes < 0 or len(received) < plan.read_bytes:
            want = 4096 if plan.read_bytes < 0 else min(4096, plan.read_bytes - len(received))
            chunk = await asyncio.wait_for(loop.sock_recv(sock, want), timeout)
            if not chunk:
                break
            received += chunk
            if received.startswith(b"HTTP/1.1 ") and not received.startswith(b"HTTP/1.1 200") and b"\r\n" in received:
                status = received[9:12].decode(errors="replace")
                summary.refused[status] = summary.refused.get(status, 0) + 1
                ended = True
                break
            if received.endswith(b"data: [DONE]\n\n") or received.endswith(b"0\r\n\r\n"):
                ended = True
                summary.completed += 1
                break
        if plan.stall:
            await asyncio.sleep(plan.stall)
        if not ended:
            summary.cut[plan.close] = summary.cut.get(plan.close, 0) + 1
    except (OSError, asyncio.TimeoutError) as exc:
        name = type(exc).__name__
        summary.client_errors[name] = summary.client_errors.get(name, 0) + 1
    finally:
        try:
            if plan.close == "rst":
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            elif plan.close == "half":
                sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        sock.close()


async def poll_health(url: str, summary: Summary, stop: asyncio.Event, period: float) -> None:
    async with httpx.AsyncClient(timeout=10) as client:
        while not stop.is_set():
            summary.health_samples += 1
            try:
                summary.health_failures += (await client.get(url + "/health")).status_code != 200
            except httpx.HTTPError:  # slow under load is not unhealthy: the final check settles it
                summary.health_timeouts += 1
            try:
                await asyncio.wait_for(stop.wait(), period)
            except asyncio.TimeoutError:
                pass


async def final_check(url: str, model: Optional[str], summary: Summary, timeout: float) -> None:
    body = {"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}
    if model:
        body["model"] = model
    async with httpx.AsyncClient(timeout=timeout) as client:
        try:
            reply = await client.post(url + "/v1/completions", json=body)
            health = await client.get(url + "/health")
        except httpx.HTTPError as exc:
            summary.final_detail = f"no answer: {exc!r}"
            return
    finished = reply.status_code == 200 and reply.json()["choices"][0]["finish_reason"] in ("length", "stop")
    summary.final_ok = finished and health.status_code == 200
    summary.final_detail = f"completion {reply.status_code}, /health {health.status_code} {health.text[:200]}"


async def run(url: str, plans: list[ClientPlan], concurrency: int, model: Optional[str] = None,
              timeout: float = 120.0, health_period: float = 0.25) -> Summary:
    """Run every plan, at most ``concurrency`` at once, while polling /health; then the final check."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    summary = Summary(clients=len(plans))
    start = time.monotonic()
    stop = asyncio.Event()
    health = asyncio.create_task(poll_health(url, summary, stop, health_period))
    gate = asyncio.Semaphore(concurrency)

    async def gated(plan: ClientPlan) -> None:
        async with gate:
            await run_client(plan, host, port, model, summary, timeout)

    try:
        await asyncio.gather(*(gated(p) for p in plans))
    finally:
        stop.set()
        await health
    await final_check(url, model, summary, timeout)
    summary.seconds = round(time.monotonic() - start, 2)
    return summary


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.disconnects", description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", default=None, help="the model name to send (default: the server's)")
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--constrained-share", type=float, default=0.3, help="share of JSON-constrained requests")
    parser.add_argument("--stall-share", type=float, default=0.5, help="share of clients that stall before closing")
    parser.add_argument("--max-stall", type=float, default=1.0, help="seconds; stalls are uniform in [0.05, this]")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds a client waits for any one read")
    parser.add_argument("--out", default=None, help="write the summary JSON here too")
    args = parser.parse_args(argv)
    plans = plan_clients(args.clients, args.seed, args.constrained_share, args.stall_share, args.max_stall)
    summary = asyncio.run(run(args.url.rstrip("/"), plans, args.concurrency, args.model, args.timeout))
    text = json.dumps(asdict(summary), sort_keys=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)
    return 0 if summary.health_failures == 0 and summary.final_ok else 1


if __name__ == "__main__":
    sys.exit(main())
