"""Everything the engine derives from the model source: weights, tokenizer, limits, EOS ids."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from aioinfer.attention.backend import get_attention_backend
from aioinfer.config import EngineConfig
from aioinfer.engine.tokenizer import load_tokenizer
from aioinfer.models.hub import download_from_hub, looks_like_hub_id
from aioinfer.models.loader import load_arch_config, load_generation_defaults, load_model, resolve_model_source

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(slots=True)
class LoadedModel:
    model: torch.nn.Module
    arch: Any  # ArchConfig
    tokenizer: Any  # a transformers tokenizer, or None for token-id-only use
    generation_defaults: dict
    eos_token_ids: tuple[int, ...]
    device: torch.device
    dtype: torch.dtype
    max_model_len: int  # tokens


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} was asked for but CUDA is not available")
    return device


def resolve_dtype(name: str, device: torch.device, checkpoint_dtype: Optional[str]) -> torch.dtype:
    if name != "auto":
        return _DTYPES[name]
    if device.type == "cpu":
        return torch.float32  # half precision on CPU is slow and not what tests compare against
    if checkpoint_dtype in ("float16", "bfloat16"):
        return _DTYPES[checkpoint_dtype]
    return torch.bfloat16


def load_for_engine(config: EngineConfig, tokenizer_loader: Optional[Callable[..., Any]] = None,
                    tp: Any = None) -> LoadedModel:
    """Weights, tokenizer and limits for one engine, on ``config.device``.

    Call it on the thread that will run the engine: it makes the device that thread's current CUDA
    device. ``tokenizer_loader`` (default: ``load_tokenizer``) lets data-parallel replicas share one
    tokenizer instead of each reading it again. ``tp`` (a TPGroup): load this rank's shard.
    """
    from aioinfer.fetch import resolve_model_name

    name = resolve_model_name(config.model.model)
    if looks_like_hub_id(name):
        name = str(download_from_hub(name))
    source = resolve_model_source(name)
    device = resolve_device(config.device)
    if device.type == "cuda" and device.index is not None:
        # The current CUDA device is per thread, and Triton launches, streams, events and graph pools
        # made without an explicit device land on it: a replica on cuda:1 must not touch cuda:0.
        torch.cuda.set_device(device)
    arch = load_arch_config(source)
    dtype = resolve_dtype(config.model.dtype, device, arch.dtype)
    model, arch = load_model(source, dtype=dtype, device=device, load_format=config.model.load_format,
                             attention_backend=get_attention_backend(config.attention_backend, device), seed=config.model.seed,
                             tp=tp)
    tokenizer = (tokenizer_loader or load_tokenizer)(source, config.model.tokenizer)
    defaults = load_generation_defaults(source)
    max_model_len = config.model.max_model_len or arch.max_position_embeddings
    if max_model_len > arch.max_position_embeddings:
        raise ValueError(f"max_model_len {max_model_len} exceeds the model's max_position_embeddings "
                         f"{arch.max_position_embeddings}")
    return LoadedModel(model=model, arch=arch, tokenizer=tokenizer, generation_defaults=defaults,
                       eos_token_ids=_eos_ids(arch, tokenizer, defaults), device=device, dtype=dtype,
                       max_model_len=max_model_len)


def _eos_ids(arch, tokenizer, defaults: dict) -> tuple[int, ...]:
    ids: list[int] = []
    for value in (defaults.get("eos_token_id"), arch.eos_token_ids,
                  getattr(tokenizer, "eos_token_id", None) if tokenizer is not None else None):
        for token_id in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(token_id, int) and token_id not in ids:
                ids.append(token_id)
    return tuple(ids)
