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
