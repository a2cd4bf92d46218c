"""Engine configuration: nested frozen dataclasses, validated on construction (ValueError names the field).

Each field a user may set is declared as an option here (options.py): its help, parser and vLLM
spellings sit on the field, and the server's variables and every command's flags are built from them.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, fields
from typing import Any, Optional

from aioinfer.layers.quantization.config import QUANTIZATION_METHODS
from aioinfer.options import check_values, context_length, declared, human_readable_int, option

DTYPES = ("auto", "float32", "float16", "bfloat16")
# vLLM's other spellings of the same types (its --dtype choices), taken and stored as the names above
DTYPE_ALIASES = {"half": "float16", "float": "float32"}
LOAD_FORMATS = ("auto", "safetensors", "gguf", "dummy")
PREEMPTION_MODES = ("recompute", "swap")
# The KV cache's element type, vLLM's names: "auto" is the model's dtype; "fp8" and "fp8_e4m3" are
# float8_e4m3fn with one scale per layer for K and one for V (layers/kv_scales.py). vLLM's third,
# "fp8_e5m2", is refused by name (CacheConfig) rather than silently stored as e4m3.
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3")
SPECULATIVE_METHODS = ("ngram",)
# The devices an engine runs on. Checked here, not when the model loads: a server loads in the
# background after it listens, and "gpu" should fail at once, not after the port is open.
_DEVICE_RE = re.compile(r"auto|cpu|cuda(:[0-9]+)?")


def is_valid_device(name: object) -> bool:
    """Whether ``name`` is a device an engine accepts: 'auto', 'cpu', 'cuda' or 'cuda:N'."""
    return isinstance(name, str) and _DEVICE_RE.fullmatch(name) is not None


def device_flag(value: str) -> str:
    """--device, refused by the parser (the variable is refused by EngineConfig's own check)."""
    if not is_valid_device(value):
        raise ValueError(f"invalid device {value!r}: expected auto, cpu, cuda or cuda:N")
    return value


def kv_cache_dtype_flag(value: str) -> str:
    """--kv-cache-dtype, and CacheConfig's check of a name it does not take: vLLM's "fp8_e5m2" (and its
    other fp8 spellings) are refused with the reason, not a bare list of choices."""
    if value in KV_CACHE_DTYPES:
        return value
    if isinstance(value, str) and value.startswith("fp8"):
        raise ValueError(f"kv_cache_dtype {value!r} is not supported: the fp8 KV cache here is float8_e4m3fn "
                         f"('fp8' or 'fp8_e4m3'); e5m2 (more range, fewer mantissa bits) is not implemented")
    raise ValueError(f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {value!r}")


def speculative_config_json(raw: str) -> dict:
    """``AIOINFER_SPECULATIVE_CONFIG`` / ``--speculative-config``: vLLM's JSON object
    (``{"method": "ngram", "num_speculative_tokens": 4, ...}``), checked here so that a bad one fails
    before anything loads; ValueError names the key."""
    import json

    SpeculativeConfig.from_value(raw)
    return json.loads(raw)


@dataclass(frozen=True, slots=True)
class ModelConfig:
    model: str  # HF folder, .gguf file, or the default model's name (an option of the server's: ServerConfig)
    # auto: float32 on CPU, the checkpoint's half type (bfloat16 default) on CUDA
    dtype: str = option("auto", help="weights' and activations' type: auto (float32 on CPU, the checkpoint's "
                        "half type on CUDA), float32, float16 (half), bfloat16", choices=(*DTYPES, *DTYPE_ALIASES))
    load_format: str = option("auto", help="weights' format", choices=LOAD_FORMATS)
    # tokens; None: the model's max_position_embeddings
    max_model_len: Optional[int] = option(None, parse=context_length, minimum=1, help="context length; vLLM's "
                                          "suffixes: 2k = 2000, 32K = 32768 (default: the model's)")
    seed: int = option(0, help="seeds dummy weights and the draws of unseeded requests")
    # folder of tokenizer files, when not beside the weights
    tokenizer: Optional[str] = option(None, help="tokenizer folder (default: beside the weights)")
    # vLLM's: where unset sampling fields take their defaults from: "auto" (the model's
    # generation_config.json), "vllm" (none: SamplingParams' own), or a folder holding one
    generation_config: str = option("auto", help="where unset sampling fields take their defaults: auto (the "
                                    "model's generation_config.json), vllm (none), or a folder holding one")
    # vLLM's: the most logprobs (sampled or prompt) a request may ask for a position; -1: the whole
    # vocabulary, which is also what a request's -1 asks for (then allowed only with this at -1 or >= it)
    max_logprobs: int = option(20, minimum=-1, help="most logprobs a request may ask for a position (-1: the "
                               "whole vocabulary)")
    # vLLM's: "fp8" quantizes an unquantized checkpoint's linear layers to FP8 as it loads; None: as
    # the checkpoint is (an FP8 checkpoint is served in FP8 either way: layers/quantization/config.py)
    quantization: Optional[str] = option(None, aliases=("-q",), choices=QUANTIZATION_METHODS,
                                         help="fp8: quantize the linear layers' weights to FP8 as they load "
                                         "(default: as the checkpoint stores them; FP8 checkpoints load as FP8)")

    def __post_init__(self) -> None:
        if isinstance(self.dtype, str) and self.dtype in DTYPE_ALIASES:
            object.__setattr__(self, "dtype", DTYPE_ALIASES[self.dtype])
        check_values(self)
        _check(isinstance(self.model, str) and self.model, "model", self.model, "must be a non-empty string")
        _check(self.generation_config in ("auto", "vllm") or (
            isinstance(self.generation_config, str) and os.path.isfile(
                os.path.join(self.generation_config, "generation_config.json"))), "generation_config",
            self.generation_config, "must be 'auto', 'vllm' or a folder with a generation_config.json")


@dataclass(frozen=True, slots=True)
class CacheConfig:
    block_size: int = option(16, minimum=1, maximum=1024, help="tokens per KV block")
    # explicit pool size; None: sized from memory
    num_kv_blocks: Optional[int] = option(None, minimum=1, help="KV pool size in blocks (default: from memory)")
    gpu_memory_utilization: float = option(0.9, above=0, maximum=1,
                                           help="CUDA: fraction of device memory the engine may use in all")
    cpu_kv_cache_gib: float = option(1.0, above=0, help="CPU: KV pool size in GiB when --num-kv-blocks is not given")
    # reuse full blocks of equal prompt prefixes (chained block hashes)
    enable_prefix_caching: bool = option(True, help="reuse KV blocks of equal prompt prefixes")
    # pinned host memory for KV blocks of swapped-out requests (GiB per engine); vLLM's swap_space
    # (vllm_options.RENAMED, which also makes --swap-space a flag of it)
    swap_space_gib: float = option(4.0, minimum=0, help="pinned host memory for swapped-out KV blocks, GiB")
    # "auto": the model's dtype; "fp8" / "fp8_e4m3": float8_e4m3fn, half the bytes of bf16 per token
    kv_cache_dtype: str = option("auto", choices=KV_CACHE_DTYPES, flag_parse=kv_cache_dtype_flag,
                                 help="KV cache element type: auto (the model's dtype), fp8 or fp8_e4m3 "
                                 "(float8_e4m3fn with per-layer K/V scales, the checkpoint's when it has them)")

    def __post_init__(self) -> None:
        if self.kv_cache_dtype not in KV_CACHE_DTYPES and isinstance(self.kv_cache_dtype, str):
            kv_cache_dtype_flag(self.kv_cache_dtype)  # the reason for vLLM's names that are not here
        check_values(self)

    @property
    def fp8_kv_cache(self) -> bool:
        """Whether the KV cache holds float8_e4m3fn."""
        return self.kv_cache_dtype in ("fp8", "fp8_e4m3")

    def metrics_info(self, num_gpu_blocks: int, num_cpu_blocks: int) -> dict[str, str]:
        """The labels of vLLM's ``vllm:cache_config_info`` gauge (its CacheConfig.metrics_info, under
        vLLM's field names), as strings; ``num_gpu_blocks``: the device pool, ``num_cpu_blocks``: the
        swap pool (0 without swap preemption)."""
        return {"block_size": str(self.block_size), "cache_dtype": self.kv_cache_dtype,
                "enable_prefix_caching": str(self.enable_prefix_caching),
                "gpu_memory_utilization": str(self.gpu_memory_utilization),
                "num_gpu_blocks": str(num_gpu_blocks), "num_gpu_blocks_override": str(self.num_kv_blocks),
                "num_cpu_blocks": str(num_cpu_blocks), "swap_space": str(self.swap_space_gib)}


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    max_num_seqs: int = option(256, minimum=1, help="requests running at once")
    # tokens computed per step (the token budget)
    max_num_batched_tokens: int = option(8192, parse=human_readable_int, minimum=1,
                                         help="tokens computed per step (2k = 2000, 8K = 8192)")
    # "recompute" | "swap" (to pinned host memory; recompute when it is full)
    preemption_mode: str = option("recompute", help="recompute | swap (to pinned host memory)",
                                  choices=PREEMPTION_MODES)

    def __post_init__(self) -> None:
        check_values(self)


@dataclass(frozen=True, slots=True)
class ParallelConfig:
    tensor_parallel_size: int = option(1, aliases=("-tp",), minimum=1, help="ranks splitting each layer (one worker "
                                       "process per extra rank)")
    # whole-model replicas in this process, one engine (and GPU) each
    data_parallel_size: int = option(1, aliases=("-dp",), minimum=1, help="whole-model replicas, one GPU (and GPU "
                                     "thread) each, behind one router")

    def __post_init__(self) -> None:
        check_values(self)


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    """vLLM's ``speculative_config``: n-gram (prompt lookup) drafts of up to ``num_speculative_tokens``
    tokens, verified in the ordinary step (spec_decode/). Neither lookup bound given: both 5; one
    given: the other equals it (vLLM's rule)."""

    num_speculative_tokens: int
    method: str = "ngram"
    prompt_lookup_min: Optional[int] = None  # shortest suffix n-gram looked up
    prompt_lookup_max: Optional[int] = None  # longest (tried first)
    # Speculate only while at most this many requests run (vLLM's key); None: the engine's default
    # (spec_decode/policy.py), chosen so that a throughput-bound batch runs as if speculation were off.
    disable_by_batch_size: Optional[int] = None

    def __post_init__(self) -> None:
        _check(self.method in SPECULATIVE_METHODS, "speculative_config.method", self.method,
               f"must be one of {SPECULATIVE_METHODS} (the only draft method aioinfer has)")
        _check(_positive_int(self.num_speculative_tokens), "speculative_config.num_speculative_tokens",
               self.num_speculative_tokens, "must be a positive integer")
        lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
        if lo is None and hi is None:
            lo = hi = 5
        lo, hi = (hi if lo is None else lo), (lo if hi is None else hi)
        _check(_positive_int(lo), "speculative_config.prompt_lookup_min", lo, "must be a positive integer")
        _check(_positive_int(hi) and hi >= lo, "speculative_config.prompt_lookup_max", hi,
               f"must be an integer >= prompt_lookup_min ({lo})")
        object.__setattr__(self, "prompt_lookup_min", lo)
        object.__setattr__(self, "prompt_lookup_max", hi)
        _check(self.disable_by_batch_size is None or _positive_int(self.disable_by_batch_size),
               "speculative_config.disable_by_batch_size", self.disable_by_batch_size,
               "must be a positive integer or None")

    @classmethod
    def from_value(cls, value: Any) -> Optional["SpeculativeConfig"]:
        """None, a SpeculativeConfig, a dict of vLLM's keys, or that dict as JSON text (the CLI's form)."""
        if value is None or isinstance(value, SpeculativeConfig):
            return value
        value = _section_keys(cls, "speculative_config", value)
        if "num_speculative_tokens" not in value:
            raise ValueError("speculative_config needs num_speculative_tokens")
        return cls(**value)


def kv_events_config_json(raw: str) -> dict:
    """``AIOINFER_KV_EVENTS_CONFIG`` / ``--kv-events-config``: vLLM's JSON object
    (``{"enable_kv_cache_events": true, "endpoint": "tcp://*:5557", ...}``), checked here; ValueError
    names the key."""
    import json

    KVEventsConfig.from_value(raw)
    return json.loads(raw)


@dataclass(frozen=True, slots=True)
class KVEventsConfig:
    """vLLM's ``kv_events_config`` (its KVEventsConfig, same keys and defaults): publish the prefix cache's
    block stores and removals over ZeroMQ for KV-aware routers (docs/kv_cache.md, KV-cache events).
    Events flow only with ``enable_kv_cache_events`` and the "zmq" publisher (vLLM's default once
    enabled); otherwise nothing is recorded."""

    enable_kv_cache_events: bool = False
    publisher: Optional[str] = None  # "zmq" or "null" (nothing published); None: "zmq" when enabled
    endpoint: str = "tcp://*:5557"  # the PUB socket: bound with a "*", "::", ipc:// or inproc://, else connected
    replay_endpoint: Optional[str] = None  # a ROUTER socket (bound) that resends buffered batches from a seq
    buffer_steps: int = 10_000  # batches (one per step with events) kept for replay
    hwm: int = 100_000  # the PUB socket's send high-water mark (messages queued per subscriber)
    max_queue_size: int = 100_000  # batches waiting for the publisher's thread; beyond it a batch is dropped
    topic: str = ""  # the first frame of every message (subscribers filter on its prefix)
    # aioinfer's own key: "map" encodes each event as a msgpack map tagged by "type" (vLLM >= 0.26);
    # "array", as a positional array led by its type (vLLM <= 0.25), for routers not yet reading maps
    event_encoding: str = "map"

    def __post_init__(self) -> None:
        if self.publisher is None:
            object.__setattr__(self, "publisher", "zmq" if self.enable_kv_cache_events else "null")
        _check(isinstance(self.enable_kv_cache_events, bool), "kv_events_config.enable_kv_cache_events",
               self.enable_kv_cache_events, "must be true or false")
        _check(self.publisher in ("zmq", "null"), "kv_events_config.publisher", self.publisher,
               "must be 'zmq' or 'null'")
        for key in ("endpoint", "replay_endpoint"):
            value = getattr(self, key)
            _check((value is None and key == "replay_endpoint") or (
                isinstance(value, str) and value.startswith(("tcp://", "ipc://", "inproc://"))),
                f"kv_events_config.{key}", value, "must be a ZeroMQ address: tcp://HOST:PORT, ipc://PATH or "
                "inproc://NAME")
        for key, least in (("buffer_steps", 0), ("hwm", 0), ("max_queue_size", 1)):
            value = getattr(self, key)
            _check(isinstance(value, int) and not isinstance(value, bool) and value >= least,
                   f"kv_events_config.{key}", value, f"must be an integer >= {least}")
        _check(isinstance(self.topic, str), "kv_events_config.topic", self.topic, "must be a string")
        _check(self.event_encoding in ("map", "array"), "kv_events_config.event_encoding", self.event_encoding,
               "must be 'map' (vLLM >= 0.26) or 'array' (vLLM <= 0.25)")
        if self.publishes:
            import importlib.util

            missing = [name for name in ("zmq", "msgspec") if importlib.util.find_spec(name) is None]
            if missing:
                raise ValueError("kv_events_config: publishing KV-cache events needs pyzmq and msgspec "
                                 f"({', '.join(missing)} not installed): pip install 'aioinfer[kv-events]'")

    @property
    def publishes(self) -> bool:
        """Whether events are recorded and sent (enabled, through the zmq publisher)."""
        return self.enable_kv_cache_events and self.publisher == "zmq"

    @classmethod
    def from_value(cls, value: Any) -> Optional["KVEventsConfig"]:
        """None, a KVEventsConfig, a dict of vLLM's keys, or that dict as JSON text (the CLI's form)."""
        if value is None or isinstance(value, KVEventsConfig):
            return value
        return cls(**_section_keys(cls, "kv_events_config", value))


@dataclass(frozen=True, slots=True)
class EngineConfig:
    model: ModelConfig
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    # auto: cuda when available, else cpu; or cpu, cuda, cuda:N
    device: str = option("auto", flag_parse=device_flag, help="auto (cuda when available, else cpu) | cpu | "
                         "cuda | cuda:N")
    # CPU only: torch intra-op threads for this process, set when the model loads (None: one, unless
    # OMP_NUM_THREADS is set; executor/model_setup.py apply_cpu_threads says why).
    # Here, not in ModelConfig: like `device`, it says how this process computes, not what the model is.
    cpu_threads: Optional[int] = option(None, minimum=1, help="CPU device: torch intra-op threads (default: 1, or "
                                        "OMP_NUM_THREADS; more pay only on an idle machine)")
    attention_backend: str = option("auto", help="attention implementation: auto, triton, flash_attn, torch")
    enforce_eager: bool = option(False, help="no CUDA graphs")  # True: no CUDA graphs
    # decode batches up to this size replay captured graphs
    max_cuda_graph_batch_size: int = option(256, minimum=1, help="CUDA: decode batches up to this size replay captured "
                                            "graphs")
    # Prefill and mixed steps of up to this many tokens replay captured graphs too (0: eager). Such a
    # step (a prompt's tail after a prefix-cache hit, a short prompt beside decode rows) is a few
    # dozen tokens through every layer: eager, its launches take longer than its kernels.
    max_cuda_graph_prefill_tokens: int = option(256, minimum=0, help="CUDA: prefill and mixed steps of up to this many "
                                                "tokens replay captured graphs too (0: eager)")
    # schedule step N+1 before step N's ids are back (None: on CUDA)
    async_scheduling: Optional[bool] = option(None, help="schedule step N+1 before step N's results are back "
                                              "(default: on CUDA, off on CPU)")
    # ``speculative_config``: n-gram drafts (None: off); a dict or its JSON is taken as SpeculativeConfig's
    speculative: Optional[SpeculativeConfig] = option(
        None, name="speculative_config", parse=speculative_config_json,
        help="speculative decoding, vLLM's JSON: '{\"method\": \"ngram\", \"num_speculative_tokens\": 8}'")
    # Structured outputs (structured_output/limits.py): the largest constraint a request may carry,
    # as text (a schema's JSON, a grammar, a regex, the choices as a JSON list), in bytes; and the
    # seconds a request waits for its constraint to compile (past it: a 400, and the same constraint
    # sent again is refused at once)
    structured_outputs_max_bytes: int = option(1 << 20, minimum=1, help="largest structured-output constraint (schema, "
                                               "grammar, regex, choices) a request may carry, in bytes")
    structured_outputs_compile_timeout: float = option(10.0, above=0, help="seconds a request waits for its constraint "
                                                       "to compile before a 400")
    # ``kv_events_config``: publish the prefix cache's block stores and removals over ZeroMQ, vLLM's
    # format (None: off); a dict or its JSON is taken as KVEventsConfig's
    kv_events: Optional[KVEventsConfig] = option(
        None, name="kv_events_config", parse=kv_events_config_json,
        help="KV-cache events for KV-aware routers, vLLM's JSON: '{\"enable_kv_cache_events\": true, "
        "\"endpoint\": \"tcp://*:5557\", \"topic\": \"kv-events\"}'")

    def __post_init__(self) -> None:
        object.__setattr__(self, "speculative", SpeculativeConfig.from_value(self.speculative))
        object.__setattr__(self, "kv_events", KVEventsConfig.from_value(self.kv_events))
        check_values(self)
        _check(is_valid_device(self.device), "device", self.device, "must be 'auto', 'cpu', 'cuda' or 'cuda:N'")
        # known before anything loads, so a server refuses it before it listens (runner_setup.py checks too)
        _check(not (self.cache.fp8_kv_cache and self.attention_backend == "flash_attn"), "attention_backend",
               self.attention_backend, f"cannot hold kv_cache_dtype={self.cache.kv_cache_dtype!r} (an fp8 KV cache): "
               "use 'auto' (Triton on CUDA, torch on CPU), 'triton' or 'torch'")

    @classmethod
    def from_kwargs(cls, model: str, **kwargs: Any) -> "EngineConfig":
        """Build from flat vLLM-style keyword arguments (``LLM(model=..., block_size=...)``); vLLM's
        spellings and no-op options are translated first (vllm_options.py)."""
        from aioinfer.vllm_options import translate

        kwargs = translate(kwargs)
        given: dict[type, dict[str, Any]] = {owner: {} for owner in _SECTIONS}
        for spec in engine_options():
            if spec.name in kwargs:
                given[spec.owner][spec.field] = kwargs.pop(spec.name)
        if kwargs:
            raise TypeError(f"unknown engine options: {sorted(kwargs)}")
        return cls(model=ModelConfig(model=model, **given[ModelConfig]), cache=CacheConfig(**given[CacheConfig]),
                   scheduler=SchedulerConfig(**given[SchedulerConfig]),
                   parallel=ParallelConfig(**given[ParallelConfig]), **given[EngineConfig])


# The dataclasses declaring the engine's options: EngineConfig's sections, then EngineConfig itself
_SECTIONS = (ModelConfig, CacheConfig, SchedulerConfig, ParallelConfig, EngineConfig)


def engine_options() -> tuple:
    """Every option of the engine (``LLM(...)``'s keywords besides ``model``), each declared once on
    its field: ModelConfig's, CacheConfig's, SchedulerConfig's, ParallelConfig's, then EngineConfig's."""
    return tuple(spec for section_cls in _SECTIONS for spec in declared(section_cls))


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _check(ok: bool, name: str, value: object, message: str) -> None:
    if not ok:
        raise ValueError(f"{name} {message}, got {value!r}")


def _section_keys(cls, name: str, value: Any) -> dict:
    """A JSON-valued option's keys (vLLM's form: a dict, or that dict as JSON text, the CLI's form),
    checked against the fields of ``cls``; raises ValueError naming the option."""
    if isinstance(value, str):
        import json

        try:
            value = json.loads(value)
        except ValueError as exc:
            raise ValueError(f"{name} must be a JSON object, got {value!r}: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{name} must be a dict (or its JSON), got {value!r}")
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(value) - known)
    if unknown:
        raise ValueError(f"{name} has unknown keys {unknown}; known: {sorted(known)}")
    return value
