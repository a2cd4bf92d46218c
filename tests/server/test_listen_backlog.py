"""The listen backlog (``listen_backlog``): raised on a socket once it starts listening (as hypercorn's
worker does after the app's start-up), and on the real ``hypercorn aioinfer.app:app`` server."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time

import anyio
import pytest

from aioinfer.entrypoints.openai.listen_backlog import LISTEN_BACKLOG, raise_backlog_once_listening
from server_process import run_server
from tiny_models import make_tiny_model_dir

pytestmark = pytest.mark.skipif(shutil.which("ss") is None or not hasattr(socket, "SO_ACCEPTCONN"),
                                reason="needs Linux and iproute2's ss to read a socket's backlog")


def listen_backlog(port: int) -> int:
    """The backlog the kernel holds for the socket listening on ``port`` (ss: Send-Q of a LISTEN line)."""
    out = subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True, check=True).stdout
    lines = [line.split() for line in out.splitlines() if line.strip()]
    assert len(lines) == 1, out
    return int(lines[0][2])


def somaxconn() -> int:
    try:
        with open("/proc/sys/net/core/somaxconn") as f:
            return int(f.read())
    except OSError:
        return 4096


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # Quart's loop: the app runs on asyncio only
@pytest.mark.anyio
async def test_a_socket_that_starts_listening_later_gets_the_backlog(anyio_backend):
    sock = socket.create_server(("127.0.0.1", 0), backlog=None)  # bound and listening: re-listen at once
    sock.listen(5)
    later = socket.socket()
    later.bind(("127.0.0.1", 0))  # bound, not listening yet: like hypercorn's at the app's start-up
    try:
        raise_backlog_once_listening(64)
        assert listen_backlog(sock.getsockname()[1]) == 64
        await anyio.sleep(0.05)
        later.listen(5)  # what asyncio's create_server does after the start-up
        with anyio.fail_after(10):
            while listen_backlog(later.getsockname()[1]) != 64:
                await anyio.sleep(0.01)
    finally:
        sock.close()
        later.close()


@pytest.mark.parametrize("argv", [None, ["{python}", "-m", "aioinfer", "serve", "--port", "{port}"]],
                         ids=["hypercorn aioinfer.app:app", "aioinfer serve"])
def test_the_real_server_listens_with_the_larger_backlog(tmp_path, argv):
    model_dir = make_tiny_model_dir(tmp_path / "qwen2", arch="qwen2")
    env = {"AIOINFER_MODEL": str(model_dir), "AIOINFER_DEVICE": "cpu", "AIOINFER_DTYPE": "float32"}
    with run_server(env, tmp_path, argv=argv) as server:
        want = min(LISTEN_BACKLOG, somaxconn())
        deadline = time.monotonic() + 30  # the app raises it within a poll (10 ms) of hypercorn's listen
        while listen_backlog(server.port) != want and time.monotonic() < deadline:
            time.sleep(0.05)
        assert listen_backlog(server.port) == want
        if argv is None:  # the app raised hypercorn's 100 (serve hands hypercorn the backlog itself)
            assert f"listen backlog: {LISTEN_BACKLOG} on 127.0.0.1:{server.port}" in server.output()
