"""A real server process for the server tests: ``hypercorn aioinfer.app:app`` on a free local port.

Used as a module-scoped fixture: one process per configuration. Teardown sends SIGTERM and
checks that the process exits within the grace period (a hang there is a bug, not noise). Every
server runs with ``AIOINFER_CPU_THREADS=1`` unless its ``env`` sets the variable.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

import httpx

GRACE = 5  # hypercorn --graceful-timeout for test servers
READY_TIMEOUT = 180.0  # seconds; covers a first-start fetch of the default model


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(self, env: dict[str, str], grace: int = GRACE, argv: Optional[list[str]] = None,
                 log_dir: Optional[Path] = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.base_url = self.url + "/v1"  # for the openai client
        self.grace = grace
        self.log = tempfile.NamedTemporaryFile(prefix="aioinfer-server-", suffix=".log", delete=False,
                                               dir=log_dir)
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("AIOINFER_")}
        if "AIOINFER_CACHE" in os.environ:
            full_env["AIOINFER_CACHE"] = os.environ["AIOINFER_CACHE"]
        full_env.update(env)
        # One torch thread unless the test says otherwise: the CI machine has 2 cores shared with the
        # pytest process and other servers, where torch's default (a thread per core, each spinning
        # while it waits for the others) made an 8-token request take 13.9 s instead of 0.74 s.
        full_env.setdefault("AIOINFER_CPU_THREADS", "1")
        full_env["PYTHONUNBUFFERED"] = "1"
        if argv is None:  # the documented way: hypercorn aioinfer.app:app
            hypercorn = Path(sys.executable).with_name("hypercorn")
            argv = [str(hypercorn), "aioinfer.app:app", "--bind", f"127.0.0.1:{self.port}",
                    "--graceful-timeout", str(int(grace))]
        else:  # e.g. the serve CLI; {port} is filled in
            argv = [a.format(port=self.port, python=sys.executable) for a in argv]
        self.proc = subprocess.Popen(
            argv,
            env=full_env, stdout=self.log, stderr=subprocess.STDOUT,
            cwd=Path(__file__).resolve().parent.parent)

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.output()}")
            try:
                if httpx.get(self.url + "/ready", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"server not ready after {timeout} s:\n{self.output()}")

    def output(self) -> str:
        return Path(self.log.name).read_text(errors="replace")

    def stop(self) -> Optional[int]:
        """SIGTERM; returns the exit code, raising if it did not exit within the grace period (+ slack)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=self.grace + 10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(f"server did not exit within the grace period:\n{self.output()}")
        return self.proc.returncode

    def close_log(self) -> None:
        self.log.close()
        os.unlink(self.log.name)


def start_server(env: dict[str, str], grace: int = GRACE, argv: Optional[list[str]] = None,
                 log_dir: Optional[Path] = None) -> ServerProcess:
    server = ServerProcess(env, grace, argv, log_dir)
    try:
        server.wait_ready()
    except BaseException:
        server.stop()
        raise
    return server


@contextmanager
def run_server(env: dict[str, str], tmp_path: Optional[Path] = None, grace: int = GRACE,
               argv: Optional[list[str]] = None) -> Iterator[ServerProcess]:
    """A ready server for the ``with`` block; afterwards SIGTERM, and it must exit cleanly within the grace."""
    server = start_server(env, grace, argv, log_dir=tmp_path)
    try:
        yield server
    except BaseException:
        server.stop()
        raise
    code = server.stop()
    assert code == 0, f"server exited with {code}:\n{server.output()}"


# ---------------------------------------------------------------------------- /metrics

def metric_samples(server: ServerProcess) -> list[tuple[str, dict[str, str], float]]:
    """Every sample of /metrics as (name, labels, value), parsed by prometheus_client's text parser."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(server.url + "/metrics", timeout=10).text
    return [(s.name, dict(s.labels), s.value) for family in text_string_to_metric_families(text)
            for s in family.samples]


def metric(samples: list[tuple[str, dict[str, str], float]], name: str, **labels: str) -> float:
    """Sum of the samples called ``name`` whose labels include ``labels`` (0 when none)."""
    return sum(value for n, lab, value in samples
               if n == name and all(lab.get(k) == v for k, v in labels.items()))


def wait_idle(server: ServerProcess, timeout: float = 30.0) -> dict:
    """Poll /metrics until nothing runs or waits and the KV cache is empty (bounded wait, asserted)."""
    deadline = time.monotonic() + timeout
    while True:
        samples = metric_samples(server)
        idle = (metric(samples, "vllm:num_requests_running") == 0 and metric(samples, "vllm:num_requests_waiting") == 0
                and metric(samples, "vllm:kv_cache_usage_perc") == 0)
        if idle or time.monotonic() > deadline:
            assert idle, "the engine did not return to idle with a free KV cache"
            return samples
        time.sleep(0.1)
