"""``cpu_threads``: torch's intra-op thread count for CPU engines (validated, applied once at load, logged)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from aioinfer.config import EngineConfig
from aioinfer.executor import model_setup
from aioinfer.server_config import ServerConfig
from server_process import run_server
from tiny_models import make_tiny_model_dir

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "2"])
def test_bad_values_are_rejected(bad):
    with pytest.raises(ValueError, match="cpu_threads must be a positive integer or None"):
        EngineConfig.from_kwargs("m", cpu_threads=bad)


def test_good_values_and_the_variable():
    assert EngineConfig.from_kwargs("m").cpu_threads is None
    assert EngineConfig.from_kwargs("m", cpu_threads=3).cpu_threads == 3
    assert ServerConfig.from_env({"AIOINFER_CPU_THREADS": "2"}).engine_kwargs == {"cpu_threads": 2}
    with pytest.raises(ValueError, match="AIOINFER_CPU_THREADS must be int, got 'many'"):
        ServerConfig.from_env({"AIOINFER_CPU_THREADS": "many"})


@pytest.fixture
def restore_torch_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_apply_sets_the_asked_count_and_logs_it(restore_torch_threads, caplog):
    with caplog.at_level(logging.INFO, logger="aioinfer.executor.model_setup"):
        assert model_setup.apply_cpu_threads(1) == 1
    assert torch.get_num_threads() == 1
    assert "CPU: 1 torch intra-op thread(s) (cpu_threads=1;" in caplog.text


def test_unset_is_one_thread_unless_omp_num_threads_says(restore_torch_threads, monkeypatch):
    # one: the only count a busy machine never makes catastrophically slow (apply_cpu_threads says why)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    torch.set_num_threads(2)
    assert model_setup.apply_cpu_threads(None) == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # the user's own choice: torch's count, which follows it, is kept
    torch.set_num_threads(2)
    monkeypatch.setattr(model_setup, "usable_cpus", lambda: 8)
    assert model_setup.apply_cpu_threads(None) == 2
    monkeypatch.setattr(model_setup, "usable_cpus", lambda: 1)
    assert model_setup.apply_cpu_threads(None) == 1  # but never more than the CPUs: capped


@pytest.mark.parametrize("threads, advice", [(2, "set AIOINFER_CPU_THREADS=1"), (1, "slower than on an idle")])
def test_a_busy_machine_is_warned_of_once(restore_torch_threads, monkeypatch, caplog, threads, advice):
    monkeypatch.setattr(model_setup, "_warned_busy", False)
    monkeypatch.setattr(model_setup, "usable_cpus", lambda: 2)
    monkeypatch.setattr(model_setup, "machine_load", lambda: 0.5)
    with caplog.at_level(logging.WARNING, logger="aioinfer.executor.model_setup"):
        model_setup.apply_cpu_threads(1)  # 0.5 + 1 thread fit 2 CPUs: no warning
        assert "oversubscribed" not in caplog.text
        monkeypatch.setattr(model_setup, "machine_load", lambda: 1.5)
        model_setup.apply_cpu_threads(threads)
        model_setup.apply_cpu_threads(threads)
    warnings = [r.getMessage() for r in caplog.records if "oversubscribed" in r.getMessage()]
    assert len(warnings) == 1 and "load average 1.5" in warnings[0] and advice in warnings[0], warnings


def test_machine_load_leaves_out_this_process():
    load = model_setup.machine_load()
    assert load is None or 0 <= load <= os.getloadavg()[0]


def test_usable_cpus_follows_the_affinity_mask():
    if hasattr(os, "sched_getaffinity"):
        assert model_setup.usable_cpus() == len(os.sched_getaffinity(0))
    else:
        assert model_setup.usable_cpus() == (os.cpu_count() or 1)


# ---------------------------------------------------------------------------- real processes

@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return str(make_tiny_model_dir(tmp_path_factory.mktemp("qwen2"), arch="qwen2"))


def test_a_server_with_cpu_threads_1_runs_one_torch_thread(model_dir, tmp_path):
    env = {"AIOINFER_MODEL": model_dir, "AIOINFER_DEVICE": "cpu", "AIOINFER_NUM_KV_BLOCKS": "64",
           "AIOINFER_MAX_MODEL_LEN": "256", "AIOINFER_CPU_THREADS": "1"}
    with run_server(env, tmp_path) as server:
        output = server.output()
    # the count torch reports after setting it, in the server process (torch's own default here is
    # one thread per core, which this machine has two of)
    assert "CPU: 1 torch intra-op thread(s) (cpu_threads=1;" in output, output


@pytest.mark.parametrize("args, env, fragment", [  # the message names the flag or variable given
    (["--cpu-threads", "0"], {}, "--cpu-threads must be a positive integer or None, got 0"),
    (["--cpu-threads", "-2"], {}, "--cpu-threads must be a positive integer or None, got -2"),
    ([], {"AIOINFER_CPU_THREADS": "0"}, "AIOINFER_CPU_THREADS must be a positive integer or None, got 0"),
    ([], {"AIOINFER_CPU_THREADS": "two"}, "AIOINFER_CPU_THREADS must be int, got 'two'"),
    (["--cpu-threads", "two"], {}, "argument --cpu-threads: invalid int value: 'two'"),
])
def test_serve_rejects_bad_values_with_one_line(model_dir, args, env, fragment):
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("AIOINFER_")}
    full_env.update(env)
    result = subprocess.run([sys.executable, "-m", "aioinfer", "serve", "--model", model_dir, "--port", "0", *args],
                            env=full_env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert result.stderr.splitlines()[-1] == f"aioinfer serve: error: {fragment}", result.stderr


def test_the_offline_cli_passes_cpu_threads(model_dir, monkeypatch, capsys):
    import aioinfer
    from aioinfer.entrypoints import cli

    seen = {}

    class FakeLLM:
        def __init__(self, **kwargs):
            seen.update(kwargs)

        def generate(self, prompts, params):
            return []

        def chat(self, conversations, params):
            return []

    monkeypatch.setattr(aioinfer, "LLM", FakeLLM)
    cli.main(["generate", "--model", model_dir, "--cpu-threads", "3", "hi"])
    assert seen["cpu_threads"] == 3
    cli.main(["chat", "--model", model_dir, "hi"])
    assert seen["cpu_threads"] is None
