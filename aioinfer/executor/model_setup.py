"""Everything an engine derives from the model source: weights, tokenizer, limits, EOS ids; and
the device, dtype and CPU threads they are loaded with.

The executor loads the model (every tensor-parallel rank its own shard, through the same
``load_for_engine``); data-parallel replicas load theirs here too, then hand it to their executor.
"""

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
    started = time.perf_counter()
    name = local_model_name(config.model.model)
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
                             tp=tp, quantization=config.model.quantization)
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


def local_model_name(name: str) -> str:
    """``name`` as a local path: the default model fetched on first use, a hub id downloaded."""
    from aioinfer.fetch import resolve_model_name

    name = resolve_model_name(name)
    if looks_like_hub_id(name):
        name = str(download_from_hub(name))
    return name


def check_model_source(name: str) -> None:
    """ValueError unless ``name`` can be loaded or fetched: a local HF folder or .gguf file, a hub id
    (downloaded at load), or the default model's name (fetched at load). Cheap (no network, a few
    stats), so that a server finds a mistyped path before it listens, not after, in the background."""
    from aioinfer.fetch import DEFAULT_MODEL, DEFAULT_MODEL_ALIASES
    from aioinfer.models.loader import resolve_model_source

    if name in DEFAULT_MODEL_ALIASES or looks_like_hub_id(name):
        return
    try:
        resolve_model_source(name)
    except (OSError, ValueError) as exc:
        reason = str(exc) if Path(name).expanduser().exists() else "no such file or folder"
        raise ValueError(f"model {name!r}: {reason} (expected a local HF folder with config.json, a .gguf "
                         f"file, a hub id such as Qwen/Qwen2.5-0.5B-Instruct, or {DEFAULT_MODEL})") from None


def usable_cpus() -> int:
    """CPUs this process may run on: its affinity mask (taskset, cpusets) where the OS has one."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def apply_cpu_threads(cpu_threads: Optional[int]) -> int:
    """Set torch's intra-op thread count for an engine on the CPU; returns the count in effect.

    ``cpu_threads`` given: exactly that many. None: one thread, unless ``OMP_NUM_THREADS`` is set
    (then torch's count, which follows it, capped at ``usable_cpus()``).

    Why one by default: it is the only count that is never catastrophically slow. torch's parallel
    ops split their work evenly across the threads and wait at a barrier for the slowest, so a
    thread that another process keeps off its core stalls every op of every step. On a 2-core
    machine with one core busy elsewhere, 2 threads made the README's chat request take 26-96 s
    and completed 0 of 16 concurrent requests in 120 s; 1 thread took 4-9 s and completed all 16 in
    23 s; on the idle machine 1 thread was as fast as 2 (the server's event loop needs a core too).
    (docs/server.md "CPU threads" has the table.) More threads pay only on an idle machine with
    cores to spare: set ``cpu_threads`` (``AIOINFER_CPU_THREADS``, ``--cpu-threads``) there. The count is
    process-wide; an application embedding the engine that chose its own passes it here, or sets
    ``OMP_NUM_THREADS``. More threads than usable CPUs is never a choice, only oversubscription:
    warned. A machine already busy (load average) is warned of once per process, whatever the
    count. CPU quotas (cgroup ``cpu.max``) are not looked at.
    """
    usable = usable_cpus()
    current = torch.get_num_threads()
    if cpu_threads is not None:
        wanted, why = cpu_threads, f"cpu_threads={cpu_threads}"
        if cpu_threads > usable:
            logger.warning("cpu_threads=%d is more than the %d CPU(s) this process may use: expect slow steps",
                           cpu_threads, usable)
    elif os.environ.get("OMP_NUM_THREADS", "").strip():
        wanted = min(current, usable)
        why = f"OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS'].strip()}" + (
            ", capped at the usable CPUs" if current > usable else "")
    else:
        wanted, why = 1, "the default, cpu_threads unset"
    if wanted != current:
        torch.set_num_threads(wanted)
    in_effect = torch.get_num_threads()
    logger.info("CPU: %d torch intra-op thread(s) (%s; %d CPU(s) usable)", in_effect, why, usable)
    _warn_if_busy(in_effect, usable)
    return in_effect


_warned_busy = False  # once per process: data-parallel replicas and repeated LLMs all get here


def _warn_if_busy(threads: int, usable: int) -> None:
    """Warn once when the machine's recent load (other processes) and these threads exceed its CPUs."""
    global _warned_busy
    load = machine_load()
    if _warned_busy or load is None or load + threads <= usable:
        return
    _warned_busy = True
    if threads > 1:
        logger.warning("CPU: the machine is oversubscribed (load average %.1f from other work, %d CPU(s) usable, "
                       "%d torch threads): each parallel op waits for threads that are not running, which made "
                       "requests 10-50x slower; set AIOINFER_CPU_THREADS=1 (--cpu-threads 1)", load, usable, threads)
    else:
        logger.warning("CPU: the machine is oversubscribed (load average %.1f from other work, %d CPU(s) usable): "
                       "steps will be slower than on an idle machine", load, usable)


def machine_load() -> Optional[float]:
    """The 1-minute load average less this process's own share of it (roughly its CPU seconds over
    the minute the average spans: a process that started loading seconds ago adds that much), or
    None where the OS has no load average."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return None
    return max(0.0, load - min(1.0, time.process_time() / 60))


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
