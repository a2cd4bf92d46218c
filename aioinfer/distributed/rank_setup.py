"""What every tensor-parallel rank does the same way: check the split, load its shard, build its runner.

The scheduler on rank 0 hands out KV block ids, so every rank must own the same number of blocks:
each rank sizes its cache from its own free memory, then all take the smallest. CUDA graphs are
likewise all-or-none: a rank that replays a graph and a rank that runs eager would still meet in
the same collectives, but a capture that failed on one rank only is a sign to trust neither.
"""

from __future__ import annotations

import dataclasses
import logging

from aioinfer.config import EngineConfig
from aioinfer.distributed.group import TPGroup
from aioinfer.errors import TensorParallelError

logger = logging.getLogger(__name__)


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


def build_rank_runner(config: EngineConfig, group: TPGroup, tokenizer_loader=None):
    """Load this rank's shard and its ModelRunner; returns (LoadedModel, ModelRunner).

    Collective: every rank of ``group`` must call it, with the same config (bar the device).
    """
    from aioinfer.engine.model_setup import load_for_engine
    from aioinfer.worker.kv_cache import KVCacheSpec, choose_num_blocks
    from aioinfer.worker.model_runner import ModelRunner

    loaded = load_for_engine(config, tokenizer_loader=tokenizer_loader, tp=group)
    model = loaded.model
    spec = KVCacheSpec(num_layers=len(model.attention_layers()), block_size=config.cache.block_size,
                       num_kv_heads=model.num_kv_heads, head_dim=loaded.arch.head_dim, dtype=loaded.dtype)
    num_blocks = group.min_int(choose_num_blocks(config, spec, loaded.device, loaded.max_model_len))
    config = dataclasses.replace(config, cache=dataclasses.replace(config.cache, num_kv_blocks=num_blocks))
    runner = ModelRunner(config, model, loaded.arch, loaded.device, loaded.dtype, loaded.max_model_len)
    runner.grammar_masks.share_over(group)  # structured outputs: rank 0's masks, sampled on every rank
    if (loaded.device.type == "cuda" and not config.enforce_eager
            and group.min_int(int(runner.graphs is not None)) == 0 and runner.graphs is not None):
        logger.warning("rank %d: another rank has no CUDA graphs, so decode runs eager here too", group.rank)
        runner.graphs = None
    return loaded, runner
