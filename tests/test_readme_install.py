"""The README's install line installs what its examples import (issue 56).

A user runs the set-up command, then the examples verbatim: the Python snippets (the openai SDK,
anyio) and ``python -m loadtest.loadtest`` (httpx, anyio, numpy). Each third-party module they
import at top level must come from a distribution that the install line names directly: aioinfer's
own dependencies or an extra in ``-e ".[...]"``. Packages that happen to be in the test environment
(where every extra is installed) would hide a missing one, so the check reads pyproject.toml, not
the environment. The load tester must also be part of the distribution, so that it runs from any
directory once installed, not only from a checkout's root.
"""

from __future__ import annotations

import ast
import re
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _pyproject() -> dict:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _req_name(req: str) -> tuple[str, list[str]]:
    """("aioinfer", ["serve", "client"]) for "aioinfer[serve,client]"; ("httpx", []) for "httpx>=0.27"."""
    m = re.match(r"\s*([A-Za-z0-9_.-]+)\s*(?:\[([^\]]*)\])?", req)
    return _norm(m.group(1)), [e.strip() for e in (m.group(2) or "").split(",") if e.strip()]


def _installed_by(extras: list[str], project: dict) -> set[str]:
    """Distribution names that ``pip install -e ".[extras]"`` names directly (self-references expanded)."""
    names, todo, seen = set(), list(extras), set()
    for req in project["dependencies"]:
        names.add(_req_name(req)[0])
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for req in project["optional-dependencies"][extra]:
            name, sub = _req_name(req)
            if name == _norm(project["name"]):
                todo.extend(sub)
            else:
                names.add(name)
    return names


def _setup_extras() -> list[str]:
    """The extras of the README's set-up command (the first bash block: install, then start)."""
    first = re.search(r"```bash\n(.*?)```", README, re.S).group(1)
    m = re.search(r'pip install torch==\S+ -e "\.\[([^\]]+)\]"', first)
    assert m, f"no 'pip install ... -e \".[extras]\"' in the README's first command: {first!r}"
    return [e.strip() for e in m.group(1).split(",")]


def _top_level_imports(source: str) -> set[str]:
    """Modules imported unconditionally at module level (guarded ImportError fallbacks are optional)."""
    mods = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.Import):
            mods.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module != "__future__":
            mods.add(node.module.split(".")[0])
    return mods


def _needed_modules() -> dict[str, str]:
    """Third-party top-level module -> where the README's examples need it."""
    needed: dict[str, str] = {}
    for i, block in enumerate(re.findall(r"```python\n(.*?)```", README, re.S)):
        for mod in _top_level_imports(block):
            needed.setdefault(mod, f"README python example {i + 1}")
    assert re.search(r"python -m loadtest\.loadtest ", README), "the README's load-test command moved"
    for path in sorted((ROOT / "loadtest").glob("*.py")):
        for mod in _top_level_imports(path.read_text()):
            needed.setdefault(mod, f"loadtest/{path.name}")
    return {m: where for m, where in needed.items()
            if m not in sys.stdlib_module_names and m not in ("aioinfer", "loadtest")}


def test_the_setup_command_installs_what_the_examples_import():
    project = _pyproject()["project"]
    installed = _installed_by(_setup_extras(), project)
    dists = packages_distributions()
    missing = []
    for mod, where in sorted(_needed_modules().items()):
        providers = {_norm(d) for d in dists.get(mod, [mod])}
        if not providers & installed:
            missing.append(f"{mod} ({where})")
    assert not missing, f"the README's set-up command does not install: {missing}"
    # The examples' own client, named directly, so that the check above is not vacuous.
    assert {"openai", "httpx", "anyio"} <= installed


def test_the_load_tester_is_part_of_the_distribution():
    from setuptools import find_packages

    pyproject = _pyproject()
    found = find_packages(str(ROOT), include=pyproject["tool"]["setuptools"]["packages"]["find"]["include"])
    assert "loadtest" in found and "aioinfer" in found
    assert not any(p.split(".")[0] in ("tests", "benchmarks") for p in found)
    module, func = pyproject["project"]["scripts"]["aioinfer-loadtest"].split(":")
    assert module == "loadtest.loadtest" and callable(getattr(__import__(module, fromlist=[func]), func))
