"""``python -m aioinfer serve``: boolean switches, and one-line errors (no traceback) for bad settings
and a port in use, checked before anything loads."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from aioinfer.entrypoints.serve_cli import config_from_args
from aioinfer.server_config import ENGINE_OPTIONS
from serve_runs import assert_one_line_error, parse, run_serve
from tiny_models import make_tiny_model_dir

ROOT = Path(__file__).resolve().parents[2]
BOOL_OPTIONS = [name for name, typ in ENGINE_OPTIONS.items() if typ is bool]


def engine_kwargs(argv: list[str], environ: dict[str, str] | None = None) -> dict:
    return config_from_args(parse(argv), environ or {}).engine_kwargs


def flag(option: str) -> str:
    return "--" + option.replace("_", "-")


def test_the_boolean_options_are_all_there():
    assert {"enforce_eager", "async_scheduling", "enable_prefix_caching"} <= set(BOOL_OPTIONS)


@pytest.mark.parametrize("option", BOOL_OPTIONS)
def test_every_boolean_option_is_an_on_off_switch(option):
    assert engine_kwargs([flag(option)])[option] is True
    assert engine_kwargs(["--no-" + flag(option)[2:]])[option] is False


@pytest.mark.parametrize("option", BOOL_OPTIONS)
def test_an_absent_switch_leaves_the_environment_in_force(option):
    variable = "AIOINFER_" + option.upper()
    assert option not in engine_kwargs([])
    assert engine_kwargs([], {variable: "false"})[option] is False
    assert engine_kwargs([], {variable: "true"})[option] is True
    # the flag beats the variable, both ways
    assert engine_kwargs(["--no-" + flag(option)[2:]], {variable: "true"})[option] is False
    assert engine_kwargs([flag(option)], {variable: "false"})[option] is True


@pytest.mark.parametrize("option", BOOL_OPTIONS)
@pytest.mark.parametrize("value", ["false", "False", "0", "true", "no"])
def test_a_value_after_a_switch_is_an_error_never_true(option, value, capsys):
    for argv in ([flag(option), value], [f"{flag(option)}={value}"]):
        with pytest.raises(SystemExit) as exit_info:
            parse(argv)
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert "takes no value" in err and flag(option) in err and "--no-" + flag(option)[2:] in err


def test_choices_and_devices_are_checked_by_argparse(capsys):
    for argv in (["--dtype", "float64"], ["--device", "gpu"], ["--device", "cuda:x"], ["--load-format", "pt"],
                 ["--preemption-mode", "never"], ["--port", "70000"]):
        with pytest.raises(SystemExit) as exit_info:
            parse(argv)
        assert exit_info.value.code == 2, argv
        assert "error: argument " + argv[0] in capsys.readouterr().err
    for device in ("auto", "cpu", "cuda", "cuda:1"):
        assert engine_kwargs(["--device", device])["device"] == device


def test_cpu_threads_flag_and_variable():
    assert engine_kwargs(["--cpu-threads", "3"])["cpu_threads"] == 3
    assert engine_kwargs([], {"AIOINFER_CPU_THREADS": "2"})["cpu_threads"] == 2
    assert engine_kwargs(["--cpu-threads", "1"], {"AIOINFER_CPU_THREADS": "2"})["cpu_threads"] == 1
    assert "cpu_threads" not in engine_kwargs([])


# ---------------------------------------------------------------------------- real processes

@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return str(make_tiny_model_dir(tmp_path_factory.mktemp("qwen2"), arch="qwen2"))


@pytest.mark.parametrize("args, fragments", [
    (["--enforce-eager", "false"], ("--enforce-eager", "takes no value")),
    (["--no-enable-prefix-caching", "off"], ("--enable-prefix-caching", "takes no value")),
    (["--device", "gpu"], ("--device", "'gpu'")),
    (["--dtype", "float64"], ("--dtype", "'float64'")),
])
def test_bad_arguments_exit_2_with_one_line(model_dir, args, fragments):
    result = run_serve(["--model", model_dir, "--port", "0", *args])
    assert_one_line_error(result, 2, *fragments)


@pytest.mark.parametrize("env, fragment", [
    ({"AIOINFER_DEVICE": "gpu"}, "AIOINFER_DEVICE must be 'auto', 'cpu', 'cuda' or 'cuda:N', got 'gpu'"),
    ({"AIOINFER_DTYPE": "float64"}, "AIOINFER_DTYPE must be one of"),
    ({"AIOINFER_ENFORCE_EAGER": "maybe"}, "AIOINFER_ENFORCE_EAGER must be bool"),
])
def test_bad_variables_exit_2_with_one_line_before_listening(model_dir, env, fragment):
    result = run_serve(["--model", model_dir, "--port", "0"], env)
    assert_one_line_error(result, 2, fragment)
    assert "Running on" not in result.stderr  # refused before hypercorn started


def test_port_in_use_exits_1_with_one_line(model_dir):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = run_serve(["--model", model_dir, "--device", "cpu", "--host", "127.0.0.1", "--port", str(port)])
    assert_one_line_error(result, 1, f"port {port} on 127.0.0.1 is already in use")
    assert result.stderr.strip() == f"aioinfer serve: error: port {port} on 127.0.0.1 is already in use"


def test_vllm_spellings_positional_model_short_flags_trust_remote_code():
    config = config_from_args(parse(["/models/qwen", "-tp", "2", "-dp", "1", "--trust-remote-code"]), {})
    assert config.model == "/models/qwen"
    assert config.engine_kwargs["tensor_parallel_size"] == 2 and config.engine_kwargs["data_parallel_size"] == 1
    assert config_from_args(parse(["m", "--model", "m"]), {}).model == "m"  # the same twice is fine
    with pytest.raises(ValueError, match="given twice"):
        config_from_args(parse(["a", "--model", "b"]), {})


def test_vllm_tool_and_swap_flags(capsys):
    """A Qwen tool-calling command line as vLLM's docs write it, and --swap-space (GiB, vLLM's name)."""
    config = config_from_args(parse(["m", "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
                                     "--swap-space", "2"]), {})
    assert config.model == "m" and config.engine_kwargs == {"swap_space_gib": 2.0}
    with pytest.raises(SystemExit) as exit_info:
        parse(["m", "--tool-call-parser", "mistral"])
    assert exit_info.value.code == 2 and "--tool-call-parser" in capsys.readouterr().err


def test_help_shows_the_defaults(capsys):
    """vLLM's --help shows defaults; here they come from the config dataclasses themselves."""
    from dataclasses import fields

    from aioinfer.config import CacheConfig, SchedulerConfig

    with pytest.raises(SystemExit):
        parse(["--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    block_size = next(f.default for f in fields(CacheConfig) if f.name == "block_size")
    max_num_seqs = next(f.default for f in fields(SchedulerConfig) if f.name == "max_num_seqs")
    assert f"tokens per KV block (default: {block_size})" in text
    assert f"requests running at once (default: {max_num_seqs})" in text
    assert "--enable-force-include-usage, --no-enable-force-include-usage" in text and "(default: off)" in text
    assert "(default: 8000)" in text or "default: 8000" in text


def test_generation_config_flag():
    assert engine_kwargs(["--generation-config", "vllm"]) == {"generation_config": "vllm"}
