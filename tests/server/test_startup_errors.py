"""A bad setting stops both server commands with one clear line on stderr, naming the setting, and a
failing status: the real ``hypercorn aioinfer.app:app`` and ``python -m aioinfer serve``, as subprocesses.

Up front (before the port is open): a malformed option, a model path that does not exist. After the
server listens (the model loads in the background): a hub id that cannot be fetched, a max_model_len
the model cannot take. hypercorn's main process would exit 0 when its worker fails; the worker ends it
with SIGKILL first (entrypoints/fatal_signals.py ``end_server``), so the shell sees 137 there.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from server_process import free_port
from tiny_models import make_tiny_model_dir

ROOT = Path(__file__).resolve().parents[2]
HYPERCORN_STATUS = -signal.SIGKILL  # subprocess's spelling of the shell's 137
NO_HUB = "nobody-aioinfer/no-such-model"  # a hub id; HF_HUB_OFFLINE makes its download fail at once
# aioinfer's log format (server_config.LOG_FORMAT) and hypercorn's own, at INFO or WARNING: no ERROR, no traceback
LOG_LINE = re.compile(r"(\d{4}-\d\d-\d\d [\d:,]+ (INFO|WARNING) [\w.]+: |\[[^]]+\] \[\d+\] \[INFO\] )")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return str(make_tiny_model_dir(tmp_path_factory.mktemp("qwen2"), arch="qwen2"))


def run(command: str, env: dict[str, str], args: tuple[str, ...] = (), port: int | None = None
        ) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("AIOINFER_")}
    full_env.update({"AIOINFER_DEVICE": "cpu", "AIOINFER_CPU_THREADS": "1", "AIOINFER_NUM_KV_BLOCKS": "64",
                     "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", **env})
    port = port or free_port()
    if command == "hypercorn":
        argv = [str(Path(sys.executable).with_name("hypercorn")), "aioinfer.app:app", "--bind", f"127.0.0.1:{port}"]
    else:
        argv = [sys.executable, "-m", "aioinfer", "serve", "--host", "127.0.0.1", "--port", str(port), *args]
    # the bound is for a server that wrongly stays up (the bug this file is about), not a timing assumption
    return subprocess.run(argv, env=full_env, cwd=ROOT, capture_output=True, text=True, timeout=300)


def assert_one_line(result: subprocess.CompletedProcess, status: int, prefix: str, *fragments: str,
                    before_listening: bool) -> None:
    err = result.stderr
    assert result.returncode == status, f"status {result.returncode}:\n{err}"
    assert "Traceback" not in err + result.stdout, err
    lines = err.splitlines()
    errors = [line for line in lines if line.startswith(prefix)]
    assert errors == [lines[-1]], err  # one error line, the last one
    for fragment in fragments:
        assert fragment in lines[-1], err
    if before_listening:
        assert len(lines) == 1, err  # nothing else: refused before anything started
    else:  # the start-up's INFO (or WARNING) log lines, a few, then the error
        assert len(lines) <= 10 and all(LOG_LINE.match(line) for line in lines[:-1]), err


# ---------------------------------------------------------------------------- refused before listening

@pytest.mark.parametrize("env, fragments", [
    ({"AIOINFER_DTYPE": "bogus"}, ("AIOINFER_DTYPE must be one of", "'bogus'")),
    ({"AIOINFER_MODEL": "/no/such/model"}, ("AIOINFER_MODEL '/no/such/model': no such file or folder",)),
    ({"AIOINFER_MAX_N": "0"}, ("AIOINFER_MAX_N must be a positive integer, got 0",)),
], ids=["dtype", "model path", "server option"])
def test_hypercorn_refuses_a_bad_setting_in_one_line(env, fragments, model_dir):
    result = run("hypercorn", {"AIOINFER_MODEL": model_dir, **env})
    assert_one_line(result, HYPERCORN_STATUS, "aioinfer: error: ", *fragments, before_listening=True)


def test_serve_names_the_flag_or_the_variable_that_was_given(model_dir):
    result = run("serve", {}, ("--model", "/no/such/model"))
    assert_one_line(result, 2, "aioinfer serve: error: ", "--model '/no/such/model': no such file or folder",
                    before_listening=True)
    result = run("serve", {"AIOINFER_MODEL": "/no/such/model"})
    assert_one_line(result, 2, "aioinfer serve: error: ", "AIOINFER_MODEL '/no/such/model'", before_listening=True)


def test_a_port_in_use_under_hypercorn_fails(model_dir):
    # hypercorn's main process binds before it imports the app: its own traceback, whose last line
    # says why, and status 1 (`serve` says it in one line: test_serve_cli.py)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        result = run("hypercorn", {"AIOINFER_MODEL": model_dir}, port=holder.getsockname()[1])
    assert result.returncode == 1, result.stderr
    assert "Address already in use" in result.stderr.splitlines()[-1], result.stderr


# ---------------------------------------------------------------------------- failing once listening

@pytest.mark.parametrize("command", ["hypercorn", "serve"])
def test_a_hub_id_that_cannot_be_fetched_ends_the_server(command):
    result = run(command, {"AIOINFER_MODEL": NO_HUB})
    prefix = "aioinfer: error: " if command == "hypercorn" else "aioinfer serve: error: "
    assert_one_line(result, HYPERCORN_STATUS if command == "hypercorn" else 1, prefix,
                    f"AIOINFER_MODEL {NO_HUB!r} is not a local folder", "Hugging Face hub", before_listening=False)


@pytest.mark.parametrize("command", ["hypercorn", "serve"])
def test_a_max_model_len_the_model_cannot_take_ends_the_server(command, model_dir):
    # found only once the model's config is read (its max_position_embeddings is 512)
    args = ("--model", model_dir, "--max-model-len", "4096") if command == "serve" else ()
    env = {} if command == "serve" else {"AIOINFER_MODEL": model_dir, "AIOINFER_MAX_MODEL_LEN": "4096"}
    result = run(command, env, args)
    prefix = "aioinfer: error: " if command == "hypercorn" else "aioinfer serve: error: "
    setting = "AIOINFER_MAX_MODEL_LEN" if command == "hypercorn" else "--max-model-len"
    assert_one_line(result, HYPERCORN_STATUS if command == "hypercorn" else 1, prefix,
                    f"{setting} 4096 exceeds the model's max_position_embeddings 512", before_listening=False)
