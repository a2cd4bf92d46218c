"""Shared fixtures: the real SmolLM2-135M-Instruct GGUF and its tokenizer, and `gpu` skips."""

from __future__ import annotations

from pathlib import Path

import pytest


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
    fail loudly rather than skip: a silently skipped real-model test hides regressions.
    """
    from aioinfer.fetch import ModelFetchError, fetch_default_model

    try:
        return fetch_default_model()
    except ModelFetchError as e:
        pytest.fail(f"cannot fetch the default model: {e}", pytrace=False)


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
