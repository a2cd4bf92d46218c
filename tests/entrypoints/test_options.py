"""Each engine and server option is declared once (options.py: metadata on its config field), and the
rest follows from it: ``serve``'s flags and ``AIOINFER_*`` variables, ``generate`` / ``chat``'s flags,
``EngineArgs``, and docs/server.md's table, held to the declarations here."""

from __future__ import annotations

import argparse
import ast
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pytest

from aioinfer.config import EngineConfig, engine_options
from aioinfer.option_flags import add_flags, flags_of
from aioinfer.options import declared, option, read_env
from aioinfer.ray.options import RayServeOptions
from aioinfer.server_config import ENGINE_OPTIONS, ServerConfig, engine_option_specs
from tiny_models import make_tiny_model_dir

ROOT = Path(__file__).resolve().parents[2]
SPEC = '{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}'
# Variables docs/server.md lists that are read where they act, not options of a config: (module, why)
OTHER_VARIABLES = {"AIOINFER_GC_YOUNG_THRESHOLD": "aioinfer/utils/gc_deferral.py"}


def all_specs():
    return (*declared(ServerConfig), *engine_option_specs(), *declared(RayServeOptions))


# ---------------------------------------------------------------------------- the docs' table

def table_rows() -> dict[str, list[str]]:
    """docs/server.md's configuration table: variable -> the flags its row names ("—": none)."""
    text = (ROOT / "docs" / "server.md").read_text()
    section = text.split("## Configuration", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) < 4 or not cells[0].startswith("`AIOINFER_"):
            continue
        variable = cells[0].strip("`")
        rows[variable] = [token.split()[0] for token in re.findall(r"`([^`]+)`", cells[1]) if token.startswith("-")]
    return rows


def test_every_declared_option_has_a_row_with_its_variable_and_flags():
    rows = table_rows()
    for spec in all_specs():
        assert spec.env_name in rows, f"docs/server.md has no row for {spec.env_name}"
        named = rows[spec.env_name]
        flags = flags_of(spec)
        if flags:
            assert named and named[0] == flags[0], (spec.env_name, named, flags)
        else:
            assert not named, (spec.env_name, named)
        switch_forms = {"--no-" + flag[2:] for flag in flags if spec.is_bool and flag.startswith("--")}
        assert set(named) <= set(flags) | switch_forms, (spec.env_name, named, flags)


def test_no_row_names_an_undeclared_variable():
    declared_variables = {spec.env_name for spec in all_specs()}
    for variable in table_rows():
        if variable in OTHER_VARIABLES:
            assert variable in (ROOT / OTHER_VARIABLES[variable]).read_text(), variable
            continue
        assert variable in declared_variables, f"docs/server.md lists {variable}, which no option declares"


# ---------------------------------------------------------------------------- generated from one declaration

def test_every_engine_option_is_a_variable_and_a_flag_of_serve_generate_and_engine_args():
    from aioinfer.engine_args import EngineArgs
    from aioinfer.entrypoints.cli import _engine_args
    from aioinfer.entrypoints.serve_cli import add_serve_parser

    serve = add_serve_parser(argparse.ArgumentParser().add_subparsers())
    generate = argparse.ArgumentParser()
    _engine_args(generate)
    engine_args = EngineArgs.add_cli_args(argparse.ArgumentParser())

    def flags(parser):
        return {flag for action in parser._actions for flag in action.option_strings}

    for spec in engine_option_specs():
        assert spec.name in ENGINE_OPTIONS and spec.env_name
        if spec.option.flag:
            assert set(flags_of(spec)) <= flags(serve) and set(flags_of(spec)) <= flags(engine_args), spec.name
        if spec in engine_options() and spec.name != "seed":  # generate's --seed: the sampling seed
            assert set(flags_of(spec)) <= flags(generate), spec.name
    assert {"-tp", "--speculative-config", "--swap-space"} <= flags(generate)


def test_a_new_boolean_option_is_one_declaration():
    """What a new field gets from its declaration alone: a switch, a variable, its default in --help."""

    @dataclass(frozen=True)
    class Toy:
        use_magic: bool = option(False, help="turn the magic on")
        width: Optional[int] = option(None, aliases=("-w",), help="how wide")

    parser = argparse.ArgumentParser()
    add_flags(parser, declared(Toy))
    assert parser.parse_args(["--use-magic", "-w", "3"]) == argparse.Namespace(use_magic=True, width=3)
    assert parser.parse_args(["--no-use-magic"]).use_magic is False
    assert "turn the magic on (default: off)" in " ".join(parser.format_help().split())
    assert read_env(declared(Toy), {"AIOINFER_USE_MAGIC": "yes", "AIOINFER_WIDTH": " "}) == {"use_magic": True}
    with pytest.raises(ValueError, match="^AIOINFER_WIDTH must be int, got 'x'$"):
        read_env(declared(Toy), {"AIOINFER_WIDTH": "x"})


def test_the_async_engine_s_defaults_named_in_help_are_its_own():
    import inspect

    from aioinfer.async_engine.engine import Engine
    from aioinfer.server_config import AsyncEngineOptions

    parameters = inspect.signature(Engine.__init__).parameters
    for spec in declared(AsyncEngineOptions):
        assert spec.name in parameters, spec.name
        named = re.search(r"default: ([0-9.]+)\)", spec.option.help)
        if named:
            assert float(named.group(1)) == parameters[spec.name].default, spec.name


def test_the_engine_s_options_are_its_fields():
    """from_kwargs maps each option to its field, the renamed one (speculative_config) included."""
    config = EngineConfig.from_kwargs("m", block_size=8, max_num_seqs=3, tensor_parallel_size=1, device="cpu",
                                      speculative_config=SPEC, swap_space=2)
    assert (config.cache.block_size, config.scheduler.max_num_seqs, config.device) == (8, 3, "cpu")
    assert config.speculative.prompt_lookup_max == 3 and config.cache.swap_space_gib == 2
    with pytest.raises(TypeError, match="unknown engine options: \\['speculative'\\]"):
        EngineConfig.from_kwargs("m", speculative=None)
    with pytest.raises(ValueError, match="^enforce_eager must be a bool, got 1$"):
        EngineConfig.from_kwargs("m", enforce_eager=1)


def _bounded_options():
    """Every declared option of a plain type: the engine's (built through from_kwargs), the server's and the
    Ray deployment's."""
    from aioinfer.config import engine_options
    from aioinfer.server_config import ServerConfig

    return [spec for spec in (*engine_options(), *declared(ServerConfig), *declared(RayServeOptions))
            if spec.kind is not None]


def _build(spec, value):
    from aioinfer.server_config import ServerConfig

    if spec.owner is ServerConfig:
        return ServerConfig(**{spec.field: value})
    if spec.owner is RayServeOptions:
        return RayServeOptions(**{spec.field: value})
    return EngineConfig.from_kwargs("m", **{spec.name: value})


@pytest.mark.parametrize("spec", _bounded_options(), ids=lambda spec: spec.name)
def test_each_declared_bound_and_type_is_checked(spec):
    """A value its declaration refuses (the wrong type, past a bound, outside the choices) is a ValueError
    naming the option, with no check written for it; the default passes. Adding an option is its field."""
    declared_option = spec.option
    refused = [object()]  # no option of a plain type takes an arbitrary object
    if spec.kind in (int, float):
        step = 1 if spec.kind is int else 0.5
        refused += [True, "1", *([1.5] if spec.kind is int else [])]
        if declared_option.minimum is not None:
            refused.append(declared_option.minimum - step)
        if declared_option.above is not None:
            refused.append(declared_option.above)  # the bound itself: it must be exceeded
        if declared_option.maximum is not None:
            refused.append(declared_option.maximum + step)
    elif spec.kind is bool:
        refused += [1, "true"]
    elif declared_option.choices:
        refused.append("not-a-choice")
    for value in refused:
        with pytest.raises(ValueError, match=f"^{spec.name} must be "):
            _build(spec, value)
    if spec.default is not None:
        _build(spec, spec.default)


def test_option_modules_import_nothing_above_them():
    """The declarations sit under what is built from them: options.py imports no aioinfer module, and
    no module declaring or building options imports the entrypoints."""
    def imports(path: str) -> set[str]:
        found = set()
        for node in ast.walk(ast.parse((ROOT / path).read_text())):
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                found.add(node.module)
        return {name for name in found if name.startswith("aioinfer")}

    assert imports("aioinfer/options.py") == set()
    for path in ("aioinfer/config.py", "aioinfer/server_config.py", "aioinfer/option_flags.py",
                 "aioinfer/engine_args.py", "aioinfer/vllm_options.py", "aioinfer/ray/options.py"):
        assert not {name for name in imports(path) if name.startswith("aioinfer.entrypoints")}, path


# ---------------------------------------------------------------------------- generate -tp --speculative-config

@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return str(make_tiny_model_dir(tmp_path_factory.mktemp("qwen2"), arch="qwen2"))


def test_generate_passes_tp_and_speculative_config(model_dir, monkeypatch):
    import aioinfer
    from aioinfer.entrypoints import cli

    seen = {}

    class FakeLLM:
        def __init__(self, **kwargs):
            seen.update(kwargs)

        def generate(self, prompts, params):
            return []

    monkeypatch.setattr(aioinfer, "LLM", FakeLLM)
    cli.main(["generate", "-tp", "1", "--speculative-config", SPEC, "--model", model_dir, "hi"])
    assert seen["tensor_parallel_size"] == 1
    assert seen["speculative_config"] == {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}
    assert EngineConfig.from_kwargs(**seen).speculative.prompt_lookup_min == 3


def test_generate_with_tp_and_speculative_config_runs_on_the_cpu(model_dir):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIOINFER_")}
    result = subprocess.run([sys.executable, "-m", "aioinfer", "generate", "-tp", "1", "--speculative-config", SPEC,
                             "--model", model_dir, "--device", "cpu", "--cpu-threads", "1", "--max-tokens", "6",
                             "hi"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("--- 'hi'\n"), result.stdout


def test_generate_refuses_a_bad_speculative_config_in_one_line(model_dir, capsys):
    from aioinfer.entrypoints import cli

    with pytest.raises(SystemExit) as exit_info:
        cli.main(["generate", "--speculative-config", '{"method": "eagle", "num_speculative_tokens": 2}',
                  "--model", model_dir, "hi"])
    assert exit_info.value.code == 2
    assert "argument --speculative-config: speculative_config.method must be one of" in capsys.readouterr().err
