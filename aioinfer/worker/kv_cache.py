"""Sizing and allocating the paged KV cache: one pool of blocks per layer.

The spec's dtype is the model's, or float8_e4m3fn for ``kv_cache_dtype="fp8"`` (one byte a value:
the same memory then holds twice the tokens of a bf16 cache, four times those of float32).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from aioinfer.attention.fp8_kv import zeros
from aioinfer.config import EngineConfig
from aioinfer.utils.dropped_memory import release_dropped_memory


@dataclass(frozen=True, slots=True)
class KVCacheSpec:
    num_layers: int
    block_size: int  # tokens per block
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype  # the cache's element type: the model's dtype or torch.float8_e4m3fn

    @property
    def bytes_per_block(self) -> int:
        """Bytes one block takes across all layers, keys and values."""
        element = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.block_size * self.num_kv_heads * self.head_dim * element


def choose_num_blocks(config: EngineConfig, spec: KVCacheSpec, device: torch.device, max_model_len: int) -> int:
    if config.cache.num_kv_blocks is not None:
        return config.cache.num_kv_blocks
    if device.type == "cuda":
        release_dropped_memory()  # an engine dropped earlier in this process may still hold the card
        free, total = torch.cuda.mem_get_info(device)
        # Leave (1 - utilization) of the card, plus room for activations of one full-budget step.
        reserve = total * (1 - config.cache.gpu_memory_utilization) + 2 * 2**30
        budget = max(free - reserve, 0)
    else:
        budget = config.cache.cpu_kv_cache_gib * 2**30
    num_blocks = int(budget // spec.bytes_per_block)
    # More than every sequence at full length is waste (matters for tiny models on CPU).
    useful = config.scheduler.max_num_seqs * -(-max_model_len // spec.block_size) + 1
    num_blocks = min(num_blocks, useful)
    if num_blocks < 2:
        raise ValueError(f"not enough memory for the KV cache ({budget / 2**30:.2f} GiB available, "
                         f"{spec.bytes_per_block} bytes per block); lower max_model_len or set num_kv_blocks")
    return num_blocks


def allocate_kv_caches(spec: KVCacheSpec, num_blocks: int, device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer: (keys, values), each [num_blocks, block_size, num_kv_heads, head_dim]."""
    shape = (num_blocks, spec.block_size, spec.num_kv_heads, spec.head_dim)
    return [(zeros(shape, spec.dtype, device), zeros(shape, spec.dtype, device)) for _ in range(spec.num_layers)]
