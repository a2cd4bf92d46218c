"""A real server's log tells each start-up phase, with its duration, in order, before "engine ready":
under ``hypercorn aioinfer.app:app`` (which configures only its own loggers) and ``python -m aioinfer serve``."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from server_process import run_server
from tiny_models import make_tiny_model_dir

DURATION = r"in \d+\.\d\d s"
# (what the line says, pattern) in the order the phases run
RESOLVE = ("model resolved", rf"INFO aioinfer\.executor\.model_setup: model SmolLM2-135M-Instruct: resolved to \S+\.gguf {DURATION}")
THREADS = ("CPU threads", r"INFO aioinfer\.executor\.model_setup: CPU: 1 torch intra-op thread\(s\)")
GGUF = ("GGUF parsed", rf"INFO aioinfer\.executor\.model_setup: GGUF metadata of \S+\.gguf: parsed {DURATION}")
WEIGHTS = ("weights", rf"INFO aioinfer\.executor\.model_setup: weights: .* loaded as float32 on cpu {DURATION} \(\d")
TOKENIZER = ("tokenizer", rf"INFO aioinfer\.executor\.model_setup: tokenizer: loaded {DURATION}")
KV_CACHE = ("KV cache", rf"INFO aioinfer\.worker\.model_runner: KV cache: 64 blocks of 16 tokens, \d+ bytes .* allocated {DURATION}")
WARM_UP = ("warm-up", rf"INFO aioinfer\.async_engine\.engine: warm-up step: done {DURATION}")
READY = ("engine ready", r"INFO aioinfer\.server: engine ready")


def assert_in_order(output: str, phases) -> None:
    lines = output.splitlines()
    where = []
    for name, pattern in phases:
        found = [i for i, line in enumerate(lines) if re.search(pattern, line)]
        assert len(found) == 1, f"{name}: {len(found)} lines match {pattern!r} in:\n{output}"
        where.append(found[0])
    assert where == sorted(where), f"phases out of order {list(zip([n for n, _ in phases], where))}:\n{output}"


ENV = {"AIOINFER_DEVICE": "cpu", "AIOINFER_DTYPE": "float32", "AIOINFER_NUM_KV_BLOCKS": "64",
       "AIOINFER_MAX_MODEL_LEN": "256"}


@pytest.mark.slow
def test_hypercorn_default_model_logs_every_phase(smollm2_gguf, tmp_path):
    # no model configured: the default one is resolved (fetched on a first start) into its GGUF
    with run_server(ENV, tmp_path) as server:
        output = server.output()
    assert_in_order(output, [RESOLVE, THREADS, GGUF, WEIGHTS, TOKENIZER, KV_CACHE, WARM_UP, READY])


def test_serve_cli_logs_every_phase(tmp_path):
    model_dir = str(make_tiny_model_dir(tmp_path / "models", arch="qwen2"))
    argv = ["{python}", "-m", "aioinfer", "serve", "--model", model_dir, "--host", "127.0.0.1", "--port", "{port}",
            "--shutdown-grace", "5"]
    with run_server(ENV, tmp_path, argv=argv) as server:
        output = server.output()
    # an HF folder: nothing to resolve or parse up front
    assert_in_order(output, [THREADS, WEIGHTS, TOKENIZER, KV_CACHE, WARM_UP, READY])
    assert "GGUF metadata" not in output and "resolved to" not in output


def test_the_hypercorn_handler_steps_aside_once_the_process_configures_logging():
    # a fresh process: the handler is process-wide state, and pytest's root logger has handlers
    code = """if True:
        import logging
        from aioinfer.server_config import configure_server_logging
        configure_server_logging()
        logging.getLogger("aioinfer.x").info("before")
        logging.basicConfig(format="ROOT %(name)s %(message)s")
        logging.getLogger("aioinfer.x").info("after")
    """
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            cwd=Path(__file__).resolve().parents[2])
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 2 and lines[0].endswith("INFO aioinfer.x: before") and lines[1] == "ROOT aioinfer.x after", lines
