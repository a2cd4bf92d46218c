"""From a loaded model to its ModelRunner: the KV cache spec, the block count, the runner, and what
the ranks of a tensor-parallel group must agree on. Every executor builds its runners here.

The KV cache spec is made once, here, from the loaded model (its layers, this rank's KV heads, its
head size) and the cache's dtype (the model's, or fp8 for ``kv_cache_dtype="fp8"``, which the
attention backend must be able to hold: refused here otherwise, before anything is allocated); the
runner allocates the cache it describes. The scheduler on rank 0 hands
out KV block ids, so every rank must own the same number of blocks: each rank sizes its cache from
its own free memory, then all take the smallest. CUDA graphs are likewise all-or-none: a rank that
replays a graph and a rank that runs eager would still meet in the same collectives, but a capture
that failed on one rank only is a sign to trust neither.
"""

from __future__ import annotations

import dataclasses
import logging

import torch

from aioinfer.attention.fp8_kv import FP8_DTYPE
from aioinfer.config import EngineConfig
from aioinfer.distributed.group import SINGLE, TPGroup
from aioinfer.errors import TensorParallelError
from aioinfer.executor.model_setup import LoadedModel, load_for_engine
from aioinfer.worker.kv_cache import KVCacheSpec, choose_num_blocks
from aioinfer.worker.model_runner import ModelRunner

logger = logging.getLogger(__name__)


def kv_cache_spec(loaded: LoadedModel, block_size: int, kv_cache_dtype: str = "auto") -> KVCacheSpec:
    """The paged KV cache of ``loaded``'s model (this rank's share of the KV heads under tensor
    parallelism), in the model's dtype or, for ``kv_cache_dtype`` "fp8" / "fp8_e4m3", float8_e4m3fn."""
    model = loaded.model
    layers = model.attention_layers()
    dtype = loaded.dtype
    if kv_cache_dtype in ("fp8", "fp8_e4m3"):
        backend = layers[0].backend
        if not getattr(backend, "supports_fp8_kv", False):
            raise ValueError(f"kv_cache_dtype={kv_cache_dtype!r} is not supported by the {backend.name!r} attention "
                             f"backend: use attention_backend 'auto' (Triton on CUDA, torch on CPU), 'triton' or "
                             f"'torch'")
        device = getattr(loaded, "device", None)
        if (backend.name == "triton" and device is not None and device.type == "cuda"
                and torch.cuda.get_device_capability(device) < (8, 9)):
            raise ValueError(f"kv_cache_dtype={kv_cache_dtype!r} on the Triton kernels needs a GPU of compute "
                             f"capability 8.9 or newer (Ada, Hopper: Triton's float8_e4m3fn conversions), got "
                             f"{torch.cuda.get_device_name(device)}; use attention_backend 'torch' or the model's "
                             f"dtype")
        dtype = FP8_DTYPE
        calibrated = sum(1 for layer in layers if (layer.k_scale, layer.v_scale) != (1.0, 1.0))
        logger.info("KV cache: fp8 (float8_e4m3fn), %s", f"the checkpoint's scales in {calibrated} of {len(layers)} "
                    "layers" if calibrated else "scale 1.0 (the checkpoint has no calibrated KV scales)")
    return KVCacheSpec(num_layers=len(layers), block_size=block_size, num_kv_heads=model.num_kv_heads,
                       head_dim=loaded.arch.head_dim, dtype=dtype)


def build_runner(config: EngineConfig, loaded: LoadedModel, group: TPGroup = SINGLE) -> ModelRunner:
    """The ModelRunner of ``loaded`` with its KV cache sized and allocated.

    ``group`` (tensor parallelism): collective, every rank calls it with the same config bar the
    device; the ranks agree on the block count and on CUDA graphs, and rank 0's grammar masks are
    sampled on every rank.
    """
    spec = kv_cache_spec(loaded, config.cache.block_size, config.cache.kv_cache_dtype)
    num_blocks = group.min_int(choose_num_blocks(config, spec, loaded.device, loaded.max_model_len))
    runner = ModelRunner(config, loaded.model, loaded.arch, loaded.device, loaded.dtype, loaded.max_model_len,
                         spec, num_blocks)
    if group.is_parallel:
        runner.grammar_masks.share_over(group)  # structured outputs: rank 0's masks, sampled on every rank
        if (loaded.device.type == "cuda" and not config.enforce_eager
                and group.min_int(int(runner.graphs is not None)) == 0 and runner.graphs is not None):
            logger.warning("rank %d: another rank has no CUDA graphs, so decode runs eager here too", group.rank)
            runner.graphs = None
    return runner


def build_rank_runner(config: EngineConfig, group: TPGroup, tokenizer_loader=None) -> tuple[LoadedModel, ModelRunner]:
    """Load this rank's shard and its ModelRunner; returns (LoadedModel, ModelRunner).

    Collective: every rank of ``group`` must call it, with the same config (bar the device).
    """
    loaded = load_for_engine(config, tokenizer_loader=tokenizer_loader, tp=group)
    return loaded, build_runner(config, loaded, group)


def check_shardable(arch, tp_size: int) -> None:
    """TensorParallelError naming every dimension of ``arch`` (an ArchConfig) that ``tp_size`` does not divide.

    The vocabulary needs no check: it is padded to a multiple of ``tp_size``.
    """
    uneven = [f"{name} ({value})" for name, value in (("num_attention_heads", arch.num_heads),
                                                      ("num_key_value_heads", arch.num_kv_heads),
                                                      ("intermediate_size", arch.intermediate_size))
              if value % tp_size]
    if uneven:
        raise TensorParallelError(f"tensor_parallel_size {tp_size} must divide {', '.join(uneven)}: "
                                  f"each rank holds whole attention heads and an equal part of the MLP")


def rank_config(config: EngineConfig, device: str) -> EngineConfig:
    """The config one rank runs with: the same, on its own device."""
    return dataclasses.replace(config, device=device)
