"""``python -m aioinfer generate`` / ``chat``: Ctrl-C exits quietly with status 130, at any point; the
model's loading is told on stderr; ``chat`` heads each answer with the user's message, not the
templated prompt.

The Ctrl-C is a real SIGINT, sent by the process to itself at a fixed point (the model's weights
loading, the first generation step) so that the test does not race the run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tiny_models import make_tiny_model_dir

ROOT = Path(__file__).resolve().parents[2]

# Runs the CLI with a SIGINT delivered when `target` is first called (the patch stands in for the user).
INTERRUPTED_CLI = """if True:
    import importlib, os, signal, sys
    module_name, name = sys.argv[1].split(":")  # module:function or module:Class.method
    owner = importlib.import_module(module_name)
    if "." in name:
        cls_name, name = name.split(".")
        owner = getattr(owner, cls_name)
    real = getattr(owner, name)

    def interrupted(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)  # the user's Ctrl-C
        return real(*args, **kwargs)

    setattr(owner, name, interrupted)
    from aioinfer.entrypoints.cli import main
    main(sys.argv[2:])
"""


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return str(make_tiny_model_dir(tmp_path_factory.mktemp("qwen2"), arch="qwen2"))


def run(argv: list[str]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIOINFER_")}
    return subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("target", ["aioinfer.executor.model_setup:load_model",
                                    "aioinfer.engine.engine_core:EngineCore.step_with_details"],
                         ids=["while loading", "while generating"])
def test_ctrl_c_exits_130_without_a_traceback(model_dir, target):
    result = run([sys.executable, "-c", INTERRUPTED_CLI, target, "generate", "--model", model_dir, "--device", "cpu",
                  "--cpu-threads", "1", "--max-tokens", "32", "Once upon a time"])
    assert result.returncode == 130, result.stderr
    assert "Traceback" not in result.stderr and "KeyboardInterrupt" not in result.stderr, result.stderr
    assert result.stdout == ""
    # what it had said so far: the loading lines, and nothing after the interruption but a newline
    lines = result.stderr.splitlines()
    assert lines[0].startswith("aioinfer generate: loading ") and lines[-1] == "", result.stderr
    assert all(line.startswith("aioinfer generate: ") for line in lines[:-1]), result.stderr


def test_chat_tells_the_loading_and_heads_answers_with_the_message(model_dir):
    result = run([sys.executable, "-m", "aioinfer", "chat", "--model", model_dir, "--device", "cpu",
                  "--cpu-threads", "1", "--max-tokens", "4", "hi there", "and you?"])
    assert result.returncode == 0, result.stderr
    headers = [line for line in result.stdout.splitlines() if line.startswith("--- ")]
    assert headers == ["--- 'hi there'", "--- 'and you?'"], result.stdout  # not the chat template's text
    assert "<|im_start|>" not in result.stdout
    err = result.stderr.splitlines()
    assert err[0] == f"aioinfer chat: loading {model_dir} on device cpu", result.stderr
    # the engine's start-up phases while it loads, then the end of the loading (then the progress bar)
    where = {phase: [i for i, line in enumerate(err) if line.startswith(f"aioinfer chat: {phase}")]
             for phase in ("weights: ", "tokenizer: loaded in ", "loaded in ")}
    assert all(len(found) == 1 for found in where.values()), result.stderr
    assert where["weights: "] < where["tokenizer: loaded in "] < where["loaded in "], result.stderr
    assert err[where["loaded in "][0]].endswith(" s; generating"), result.stderr


def test_a_bad_setting_is_one_line(model_dir):
    result = run([sys.executable, "-m", "aioinfer", "generate", "--model", model_dir + "-typo", "hello"])
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"aioinfer generate: error: --model '{model_dir}-typo': no such file or folder")
