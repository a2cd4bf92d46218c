"""The KV cache spec an executor builds (executor/runner_setup.py): the model's dtype for "auto",
float8_e4m3fn for vLLM's fp8 names, and a clear refusal, before anything is allocated, when the
attention backend cannot hold an fp8 cache (flash-attn: refused by the config already, and by the
backend itself, tested on a GPU with it installed)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from aioinfer.attention.fp8_kv import FP8_DTYPE
from aioinfer.attention.registry import get_attention_backend
from aioinfer.attention.torch_backend import TorchAttentionBackend
from aioinfer.executor.runner_setup import kv_cache_spec
from aioinfer.models.loader import load_model
from tiny_models import make_tiny_model_dir


class _NoFp8(TorchAttentionBackend):
    name = "flash_attn"
    supports_fp8_kv = False


def _loaded(path, backend):
    model, arch = load_model(str(path), torch.float32, "cpu", attention_backend=backend)
    return SimpleNamespace(model=model, arch=arch, dtype=torch.float32)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model_dir(tmp_path_factory.mktemp("qwen2"), arch="qwen2")


def test_spec_dtype_follows_kv_cache_dtype(model_dir):
    loaded = _loaded(model_dir, get_attention_backend("torch"))
    assert kv_cache_spec(loaded, 16).dtype == torch.float32
    assert kv_cache_spec(loaded, 16, "auto").dtype == torch.float32
    for name in ("fp8", "fp8_e4m3"):
        spec = kv_cache_spec(loaded, 16, name)
        assert spec.dtype == FP8_DTYPE and spec.bytes_per_block * 4 == kv_cache_spec(loaded, 16).bytes_per_block


def test_a_backend_without_fp8_is_refused_with_what_to_use(model_dir):
    loaded = _loaded(model_dir, _NoFp8())
    assert kv_cache_spec(loaded, 16).dtype == torch.float32  # fine with the model's dtype
    with pytest.raises(ValueError, match=r"kv_cache_dtype='fp8' is not supported by the 'flash_attn' attention "
                                         r"backend: use attention_backend 'auto'"):
        kv_cache_spec(loaded, 16, "fp8")


def test_the_config_refuses_flash_attn_with_fp8_before_anything_loads():
    from aioinfer.config import EngineConfig

    with pytest.raises(ValueError, match=r"^attention_backend cannot hold kv_cache_dtype='fp8'"):
        EngineConfig.from_kwargs("m", kv_cache_dtype="fp8", attention_backend="flash_attn")
    for backend in ("auto", "triton", "torch"):
        assert EngineConfig.from_kwargs("m", kv_cache_dtype="fp8", attention_backend=backend).cache.fp8_kv_cache


@pytest.mark.gpu
def test_gpu_flash_attn_refuses_an_fp8_cache():
    pytest.importorskip("flash_attn")
    backend = get_attention_backend("flash_attn", torch.device("cuda"))
    assert not backend.supports_fp8_kv
    cache = torch.zeros(4, 256, 2, 64, dtype=torch.uint8, device="cuda").view(FP8_DTYPE)
    k = torch.zeros(3, 2, 64, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match="fp8 KV cache"):
        backend.write_kv(k, k, cache, cache, torch.zeros(3, dtype=torch.int64, device="cuda"))
