"""Everything the engine derives from the model source: weights, tokenizer, limits, EOS ids."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from aioinfer.attention.registry import get_attention_backend
from aioinfer.config import EngineConfig
from aioinfer.models.hub import download_from_hub, looks_like_hub_id
from aioinfer.models.loader import (load_arch_config, load_generation_defaults, load_model, open_model_source,
                                    read_generation_config)
from aioinfer.text.tokenizer import load_tokenizer

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
    tokenizer instead of each reading it again. ``tp`` (a TPGroup): load this rank's shard. Each
    phase is logged at INFO with its duration (a first start can take a minute, silently otherwise).
    """
    from aioinfer.fetch import resolve_model_name

    started = time.perf_counter()
    name = resolve_model_name(config.model.model)  # the default model is fetched on first use
    if looks_like_hub_id(name):
        name = str(download_from_hub(name))
    if name != config.model.model:
        logger.info("model %s: resolved to %s in %.2f s", config.model.model, name, time.perf_counter() - started)
    device = resolve_device(config.device)
    if device.type == "cuda" and device.index is not None:
        # The current CUDA device is per thread, and Triton launches, streams, events and graph pools
        # made without an explicit device land on it: a replica on cuda:1 must not touch cuda:0.
        torch.cuda.set_device(device)
    if device.type == "cpu":
        apply_cpu_threads(config.cpu_threads)
    phase = time.perf_counter()
    source = open_model_source(name)  # a GGUF is parsed here, once, for config, weights and tokenizer
    if source.gguf is not None:
        logger.info("GGUF metadata of %s: parsed in %.2f s", source.path.name, time.perf_counter() - phase)
    arch = load_arch_config(source)
    dtype = resolve_dtype(config.model.dtype, device, arch.dtype)
    phase = time.perf_counter()
    model, arch = load_model(source, dtype=dtype, device=device, load_format=config.model.load_format,
                             attention_backend=get_attention_backend(config.attention_backend, device), seed=config.model.seed,
                             tp=tp)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    logger.info("weights: %s (%s) loaded as %s on %s in %.2f s (%.1f MiB)", source.path.name,
                "dummy" if config.model.load_format == "dummy" else source.kind, str(dtype).removeprefix("torch."),
                device, time.perf_counter() - phase, weight_bytes / 2**20)
    phase = time.perf_counter()
    tokenizer = (tokenizer_loader or load_tokenizer)(source, config.model.tokenizer)
    logger.info("tokenizer: %s in %.2f s", "loaded" if tokenizer is not None else "none (token ids only)",
                time.perf_counter() - phase)
    defaults = load_generation_defaults(source)  # the model's own: its EOS ids whatever generation_config says
    max_model_len = config.model.max_model_len or arch.max_position_embeddings
    if max_model_len > arch.max_position_embeddings:
        raise ValueError(f"max_model_len {max_model_len} exceeds the model's max_position_embeddings "
                         f"{arch.max_position_embeddings}")
    return LoadedModel(model=model, arch=arch, tokenizer=tokenizer,
                       generation_defaults=sampling_defaults(config.model.generation_config, defaults),
                       eos_token_ids=_eos_ids(arch, tokenizer, defaults), device=device, dtype=dtype,
                       max_model_len=max_model_len)


def usable_cpus() -> int:
    """CPUs this process may run on: its affinity mask (taskset, cpusets) where the OS has one."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def apply_cpu_threads(cpu_threads: Optional[int]) -> int:
    """Set torch's intra-op thread count for an engine on the CPU; returns the count in effect.

    ``cpu_threads`` given: exactly that many. None: torch's count, capped at ``usable_cpus()`` but
    never raised. Why not simply set the usable count: the count is process-wide, and a process that
    embeds the engine (or its OMP_NUM_THREADS) may have chosen fewer on purpose, for its own work or
    for the other processes on the machine; more threads than usable CPUs, though, is never a
    choice, only oversubscription (torch's default comes from its OpenMP/MKL runtime, which may
    count cores outside this process's affinity mask), where every parallel op waits on threads
    that are not running. Even the usable count oversubscribes a machine shared with other busy
    processes (an 8-token request took 13.9 s there instead of 0.74 s with one thread): set
    ``cpu_threads`` for that. CPU quotas (cgroup ``cpu.max``) are not looked at.
    """
    usable = usable_cpus()
    current = torch.get_num_threads()
    if cpu_threads is not None:
        wanted, why = cpu_threads, f"cpu_threads={cpu_threads}"
        if cpu_threads > usable:
            logger.warning("cpu_threads=%d is more than the %d CPU(s) this process may use: expect slow steps",
                           cpu_threads, usable)
    elif current > usable:
        wanted, why = usable, f"torch's {current} capped at the usable CPUs"
    else:
        wanted, why = current, "torch's default, cpu_threads unset"
    if wanted != current:
        torch.set_num_threads(wanted)
    in_effect = torch.get_num_threads()
    logger.info("CPU: %d torch intra-op thread(s) (%s; %d CPU(s) usable)", in_effect, why, usable)
    return in_effect


def _eos_ids(arch, tokenizer, defaults: dict) -> tuple[int, ...]:
    ids: list[int] = []
    for value in (defaults.get("eos_token_id"), arch.eos_token_ids,
                  getattr(tokenizer, "eos_token_id", None) if tokenizer is not None else None):
        for token_id in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(token_id, int) and token_id not in ids:
                ids.append(token_id)
    return tuple(ids)


def sampling_defaults(generation_config: str, model_defaults: dict) -> dict:
    """The sampling defaults ``generation_config`` (vLLM's option) names: "auto" the model's
    generation_config.json, "vllm" none, otherwise a folder's generation_config.json."""
    if generation_config == "auto":
        return model_defaults
    if generation_config == "vllm":
        return {}
    return read_generation_config(Path(generation_config))  # a folder (ModelConfig checked it has one)
