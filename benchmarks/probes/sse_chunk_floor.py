"""Probe: serving-thread CPU per SSE chunk in hypercorn and Quart, the HTTP floor per streamed token (CPU).

What one SSE chunk costs the serving process in hypercorn, before any engine work: the floor
under the HTTP server's host budget per streamed token (CPU, any machine).

    python -m benchmarks.probes.sse_chunk_floor --chunks 100000 --out chunk_floor.json

A hypercorn process serves one response of ``--chunks`` chunks of an SSE event's size (about what
one token's event is), as fast as a raw-socket client in this process reads them, three ways:
``raw`` (a bare ASGI app awaiting ``send`` per chunk: hypercorn, h11 and the socket write alone),
``quart`` (the same body through a Quart route, as aioinfer serves it) and ``quart_x4`` (Quart
with four events per chunk: what ``--stream-interval 4`` saves). The app reads its own thread's
CPU (user and system, ``RUSAGE_THREAD``) around the body, so the figure is the event loop's cost
per chunk. With stream_interval 1 every streamed token is one chunk: at N tok/s the server spends
N x this figure of its one interpreter lock on HTTP framing and writes alone.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import dump, environment, format_table

EVENT = b'data: {"id":"cmpl-0123456789abcdef0123456789abcdef","object":"text_completion","created":1764590000,' \
        b'"model":"qwen","choices":[{"index":0,"text":" token","logprobs":null,"finish_reason":null,' \
        b'"stop_reason":null}]}\n\n'


def _chunks() -> int:
    return int(os.environ["SSE_FLOOR_CHUNKS"])


def _events_per_chunk() -> int:
    return int(os.environ.get("SSE_FLOOR_EVENTS_PER_CHUNK", "1"))


def _report(started: resource.struct_rusage) -> None:
    ended = resource.getrusage(resource.RUSAGE_THREAD)
    Path(os.environ["SSE_FLOOR_OUT"]).write_text(json.dumps(
        {"user_s": ended.ru_utime - started.ru_utime, "sys_s": ended.ru_stime - started.ru_stime}))


async def raw_app(scope, receive, send) -> None:
    if scope["type"] != "http":
        return
    started = resource.getrusage(resource.RUSAGE_THREAD)
    chunk = EVENT * _events_per_chunk()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
    for _ in range(_chunks()):
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})
    _report(started)


def _quart_app():
    from quart import Quart, Response

    app = Quart(__name__)

    @app.post("/")
    async def stream():
        chunk = EVENT * _events_per_chunk()

        async def body():
            started = resource.getrusage(resource.RUSAGE_THREAD)
            for _ in range(_chunks()):
                yield chunk
            _report(started)

        response = Response(body(), content_type="text/event-stream")
        response.timeout = None
        return response

    return app


quart_app = _quart_app() if os.environ.get("SSE_FLOOR_APP") == "quart_app" else None

VARIANTS = {"raw": ("raw_app", 1), "quart": ("quart_app", 1), "quart_x4": ("quart_app", 4)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _read_response(port: int) -> int:
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
        received = 0
        tail = b""
        while True:
            data = s.recv(1 << 20)
            if not data:
                break
            received += len(data)
            tail = (tail + data)[-5:]
            if tail == b"0\r\n\r\n":  # the chunked body's end
                break
        return received


def run_variant(name: str, chunks: int, repeats: int) -> dict:
    app, per_chunk = VARIANTS[name]
    port = _free_port()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cpu.json"
        env = dict(os.environ, SSE_FLOOR_CHUNKS=str(chunks), SSE_FLOOR_EVENTS_PER_CHUNK=str(per_chunk),
                   SSE_FLOOR_OUT=str(out), SSE_FLOOR_APP=app, PYTHONPATH=os.pathsep.join(
                       [str(Path.cwd()), os.environ.get("PYTHONPATH", "")]))
        server = subprocess.Popen([sys.executable, "-m", "hypercorn", f"benchmarks.probes.sse_chunk_floor:{app}",
                                   "--bind", f"127.0.0.1:{port}"], env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline or server.poll() is not None:
                        raise RuntimeError("hypercorn did not start")
                    time.sleep(0.2)
            runs = []
            for _ in range(repeats + 1):  # the first one warms up
                out.unlink(missing_ok=True)
                received = _read_response(port)
                for _ in range(100):
                    if out.exists():
                        break
                    time.sleep(0.05)
                cpu = json.loads(out.read_text())
                runs.append({"bytes": received, **cpu})
        finally:
            server.terminate()
            server.wait(timeout=30)
    best = min(runs[1:], key=lambda r: r["user_s"] + r["sys_s"])
    return {"chunks": chunks, "events_per_chunk": per_chunk,
            "user_us_per_chunk": 1e6 * best["user_s"] / chunks, "sys_us_per_chunk": 1e6 * best["sys_s"] / chunks,
            "us_per_event": 1e6 * (best["user_s"] + best["sys_s"]) / (chunks * per_chunk), "runs": runs}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--chunks", type=int, default=100_000)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--out", default=None)
    args = p.parse_args()
    results = {name: run_variant(name, args.chunks, args.repeats) for name in args.variants.split(",")}
    dump(args.out, {"benchmark": "sse_chunk_floor", "environment": environment(), "argv": vars(args),
                    "results": results})
    rows = [[name, r["events_per_chunk"], r["user_us_per_chunk"], r["sys_us_per_chunk"], r["us_per_event"]]
            for name, r in results.items()]
    print(format_table(["app", "events per chunk", "user us/chunk", "sys us/chunk", "CPU us per event"], rows))


if __name__ == "__main__":
    main()
