"""SIGTERM while requests run, on real server processes (both entry points): every response that is
still open when the grace period ends finishes well-formed, and the log has no traceback.

A grace of 0 makes "still open at the end of the grace" certain rather than a race: the requests
below need thousands of steps, and the abort comes at once.
"""

from __future__ import annotations

import json
import signal
import threading
import time

import httpx
import pytest

from server_process import metric, metric_samples, start_server
from tiny_models import make_tiny_model_dir

LONG = {"max_tokens": 3000, "ignore_eos": True}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(make_tiny_model_dir(tmp_path_factory.mktemp("qwen2"), arch="qwen2", max_position_embeddings=4096))


def _argv(entry: str, model_dir: str) -> list[str]:
    if entry == "serve":
        return ["{python}", "-m", "aioinfer", "serve", "--model", model_dir, "--port", "{port}", "--device", "cpu",
                "--shutdown-grace", "0"]
    return ["{python}", "-m", "hypercorn", "aioinfer.app:app", "--bind", "127.0.0.1:{port}", "--graceful-timeout", "0"]


@pytest.mark.parametrize("entry", ["serve", "hypercorn"])
def test_requests_open_when_the_grace_ends_end_well_formed(model_dir, entry):
    env = {"AIOINFER_MODEL": model_dir, "AIOINFER_DEVICE": "cpu", "AIOINFER_NUM_KV_BLOCKS": "1024"}
    server = start_server(env, grace=0, argv=_argv(entry, model_dir))
    try:
        outcome = {}

        def non_stream():
            outcome["full"] = httpx.post(server.url + "/v1/completions", json={"prompt": [3, 4], **LONG}, timeout=120)

        thread = threading.Thread(target=non_stream)
        thread.start()
        body = {"messages": [{"role": "user", "content": "hi"}], "stream": True, "n": 2, **LONG}
        with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=120) as response:
            lines = response.iter_lines()
            next(line for line in lines if line.startswith("data: "))
            deadline = time.monotonic() + 120
            while metric(metric_samples(server), "vllm:num_requests_running") < 3:  # both choices and the other
                assert time.monotonic() < deadline, "the requests never ran together"
                time.sleep(0.05)
            server.proc.send_signal(signal.SIGTERM)
            events = [line[len("data: "):] for line in lines if line.startswith("data: ")]
        thread.join(timeout=120)

        assert events[-1] == "[DONE]"
        finals = [json.loads(e)["choices"][0] for e in events[:-1]
                  if json.loads(e)["choices"] and json.loads(e)["choices"][0]["finish_reason"] is not None]
        assert sorted(c["index"] for c in finals) == [0, 1] and all(c["finish_reason"] == "abort" for c in finals)

        full = outcome["full"]
        assert full.status_code == 503, full.text
        assert full.json()["error"]["code"] == "shutting_down"

        assert server.proc.wait(timeout=60) == 0, server.output()
        log = server.output()
        assert "Traceback" not in log and "UnexpectedMessageError" not in log, log
    finally:
        server.stop()
        server.close_log()
