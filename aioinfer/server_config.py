"""Server settings: one frozen record, read from ``AIOINFER_*`` environment variables or CLI flags.

Every engine option of the offline ``LLM`` has one variable (``AIOINFER_MAX_MODEL_LEN`` for
``max_model_len``, ...); docs/server.md lists them all. A malformed value raises ``ValueError``
naming the variable, so ``hypercorn aioinfer.app:app`` fails at import with a clear message
instead of serving a misconfigured engine.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass, field, fields
from typing import Any, Mapping, Optional, Union

ENV_PREFIX = "AIOINFER_"


def speculative_config_json(raw: str) -> dict:
    """``AIOINFER_SPECULATIVE_CONFIG`` / ``--speculative-config``: vLLM's JSON object
    (``{"method": "ngram", "num_speculative_tokens": 4, ...}``), checked here so that a bad one fails
    before anything loads; ValueError names the key."""
    import json

    from aioinfer.config import SpeculativeConfig

    SpeculativeConfig.from_value(raw)
    return json.loads(raw)


def string_list_json(raw: str) -> tuple[str, ...]:
    """``--allowed-origins`` and its siblings: vLLM's JSON list of strings (``'["https://a.example"]'``)."""
    import json

    try:
        value = json.loads(raw)
    except ValueError:
        value = None
    if not (isinstance(value, list) and all(isinstance(item, str) for item in value)):
        raise ValueError(f"expected a JSON list of strings such as '[\"https://app.example\"]', got {raw!r}")
    return tuple(value)


# vLLM's size suffixes: lowercase, powers of 1000 (decimals allowed); uppercase, powers of 1024 (whole numbers)
_DECIMAL_SUFFIXES = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY_SUFFIXES = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def human_readable_int(raw: str) -> int:
    """vLLM's integers for --max-model-len and --max-num-batched-tokens: ``4096``, or with a suffix,
    case-sensitive as vLLM's: ``2k`` = 2000 and ``25.6k`` = 25600 (k, m, g, t: powers of 1000, decimals
    allowed, the product truncated as vLLM's is), ``32K`` = 32768 (K, M, G, T: powers of 1024, whole
    numbers only). ValueError for anything else."""
    if isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    from decimal import Decimal

    text = str(raw).strip()
    number, suffix = text[:-1], text[-1:]
    if suffix in _DECIMAL_SUFFIXES and _is_number(number, decimals=True):
        return int(Decimal(number) * _DECIMAL_SUFFIXES[suffix])  # Decimal: "1.001k" is 1001, not 1000
    if suffix in _BINARY_SUFFIXES and _is_number(number, decimals=False):
        return int(number) * _BINARY_SUFFIXES[suffix]
    if _is_number(text.removeprefix("-"), decimals=False):
        return int(text)
    hint = (f" (decimals only with k, m, g, t: {number}{suffix.lower()} is {number} x 1000)"
            if suffix in _BINARY_SUFFIXES and _is_number(number, decimals=True) else "")
    raise ValueError(f"expected an integer such as 4096, 2k (2000) or 32K (32768), got {raw!r}{hint}")


def context_length(raw: str) -> int:
    """--max-model-len: ``human_readable_int``; vLLM's ``auto`` / ``-1`` (the longest context that fits
    in memory) is refused with what to do instead."""
    if str(raw).strip().lower() in ("auto", "-1"):
        raise ValueError(f"{raw!r} (vLLM: the longest context that fits in memory) is not supported: leave "
                         "the option out for the model's own context length, or give a length")
    return human_readable_int(raw)


def _is_number(text: str, decimals: bool) -> bool:
    whole, _, fraction = text.partition(".") if decimals else (text, "", "")
    return whole.isascii() and whole.isdigit() and (not fraction or (fraction.isascii() and fraction.isdigit()))


# Engine options (passed to Engine(**engine_kwargs)) and their types. None of them is set unless
# asked for, so the engine's own defaults stay the single source of truth.
ENGINE_OPTIONS: dict[str, type] = {
    "dtype": str,
    "generation_config": str,
    "max_model_len": context_length,
    "max_logprobs": int,
    "block_size": int,
    "num_kv_blocks": int,
    "max_num_seqs": int,
    "max_num_batched_tokens": human_readable_int,
    "device": str,
    "cpu_threads": int,
    "load_format": str,
    "seed": int,
    "tokenizer": str,
    "gpu_memory_utilization": float,
    "cpu_kv_cache_gib": float,
    "attention_backend": str,
    "enforce_eager": bool,
    "async_scheduling": bool,
    "data_parallel_size": int,
    "tensor_parallel_size": int,
    "enable_prefix_caching": bool,
    "preemption_mode": str,
    "swap_space_gib": float,
    "speculative_config": speculative_config_json,
    "structured_outputs_max_bytes": int,
    "structured_outputs_compile_timeout": float,
    # async-engine options
    "max_waiting_requests": int,
    "max_waiting_prompt_tokens": int,
    "stream_buffer_size": int,
    "stream_interval": int,
    "stall_timeout": float,
    "host_cpu": int,
    "fault_inject_step": int,  # tests only: make the step loop fail at this step
}


@dataclass(frozen=True, slots=True)
class ServerConfig:
    model: Optional[str] = None  # HF folder, .gguf file or hub id; None: the default model (fetched)
    # Name(s) in /v1/models, all accepted as a request's model; responses carry the first (vLLM's
    # --served-model-name takes several). None: engine.model_name
    served_model_name: Union[str, tuple[str, ...], None] = None
    # When set, every route but /health, /ready, /metrics needs 'Bearer <key>' with this key or one of
    # these (vLLM's --api-key takes several)
    api_key: Union[str, tuple[str, ...], None] = None
    max_body_bytes: int = 8 * 1024 * 1024  # larger request bodies get 413
    shutdown_grace: float = 10.0  # seconds in-flight requests may run on after SIGTERM before being aborted
    max_n: int = 64  # upper bound on `n` (each choice is a separate engine request)
    # Most (token, logprob) entries one response may carry, prompt and output logprobs of every choice
    # together (SamplingParams.logprob_entries); more is a 400 before admission. An entry is ~80 bytes of
    # JSON and ~370 bytes of host memory at the peak of building the response: 2**20 is ~80 MB and ~0.4 GB.
    max_logprob_entries: int = 1 << 20
    log_requests: bool = True  # one JSON line per finished request on the "aioinfer.requests" logger
    # Connections the kernel queues for accept (0: leave the HTTP server's own, hypercorn's 100);
    # entrypoints/openai/listen_backlog.py says why 2048.
    listen_backlog: int = 2048
    # vLLM's switches of the same names (off by default, as there):
    enable_request_id_headers: bool = False  # every response carries X-Request-Id (the client's, or a new one)
    # every stream's chunks carry usage and a usage chunk ends it, whatever stream_options say (vLLM's)
    enable_force_include_usage: bool = False
    enable_tokenizer_info_endpoint: bool = False  # GET /tokenizer_info (it shows the chat template)
    return_tokens_as_token_ids: bool = False  # logprobs name tokens "token_id:<id>" unless a request says no
    # Under tool_choice "auto", hold calls to strict functions to their schemas (tool_calls.py
    # strict_calls; vLLM's VLLM_ENFORCE_STRICT_TOOL_CALLING, off there too: such requests then take
    # the constrained path's cost at every step)
    enforce_strict_tools: bool = False
    # vLLM's structured_outputs_config.disable_additional_properties, on by default (vLLM's default
    # backend, xgrammar, behaves so): in a request's JSON schemas, an object that lists its properties
    # takes no other keys unless it says additionalProperties: true; a request's own
    # structured_outputs.disable_additional_properties wins (structured_output/closed_objects.py)
    disable_additional_properties: bool = True
    # vLLM's --chat-template: a Jinja file, or the template itself, used instead of the tokenizer's
    chat_template: Optional[str] = None
    # vLLM's CORS options, with the semantics of the Starlette middleware vLLM uses (cors.py): what a
    # page of another origin may send; "*" is any. No origins: CORS off (no page of another origin
    # can read a response or pass a preflight).
    allowed_origins: tuple[str, ...] = ("*",)
    allow_credentials: bool = False  # cookies / Authorization from such pages (the Origin is echoed, never "*")
    allowed_methods: tuple[str, ...] = ("*",)
    allowed_headers: tuple[str, ...] = ("*",)  # request headers a preflight may ask for
    # vLLM's --root-path: the prefix a proxy serves the app under; requests work with it or without it
    root_path: Optional[str] = None
    # vLLM's TLS options (`serve` only: under plain hypercorn, its --certfile, --keyfile, --ca-certs, ...)
    ssl_keyfile: Optional[str] = None  # PEM private key (None: in ssl_certfile)
    ssl_certfile: Optional[str] = None  # PEM certificate chain; set: HTTPS only
    ssl_ca_certs: Optional[str] = None  # PEM CAs that client certificates are checked against
    ssl_cert_reqs: int = 0  # client certificates: 0 none, 1 optional, 2 required (Python's ssl.CERT_*)
    ssl_ciphers: Optional[str] = None  # OpenSSL cipher list for TLS <= 1.2 (None: hypercorn's)
    # vLLM's --enable-ssl-refresh: the certificate, key and CA files are read again when they change
    # (entrypoints/ssl_refresh.py); no effect without ssl_certfile, as in vLLM
    enable_ssl_refresh: bool = False
    engine_kwargs: dict[str, Any] = field(default_factory=dict)  # see ENGINE_OPTIONS

    def __post_init__(self) -> None:
        for name in ("served_model_name", "api_key"):
            self._one_or_more(name)
        if not (isinstance(self.max_body_bytes, int) and self.max_body_bytes > 0):
            raise ValueError(f"max_body_bytes must be a positive integer, got {self.max_body_bytes!r}")
        if not self.shutdown_grace >= 0:
            raise ValueError(f"shutdown_grace must be >= 0, got {self.shutdown_grace!r}")
        if not (isinstance(self.max_n, int) and self.max_n >= 1):
            raise ValueError(f"max_n must be a positive integer, got {self.max_n!r}")
        if not (isinstance(self.max_logprob_entries, int) and self.max_logprob_entries >= 1):
            raise ValueError(f"max_logprob_entries must be a positive integer, got {self.max_logprob_entries!r}")
        if not (isinstance(self.listen_backlog, int) and self.listen_backlog >= 0):
            raise ValueError(f"listen_backlog must be an integer >= 0, got {self.listen_backlog!r}")
        if self.chat_template is not None:
            self.resolved_chat_template()  # a missing file fails at start-up, not at the first chat request
        for name in ("allowed_origins", "allowed_methods", "allowed_headers"):
            value = getattr(self, name)
            if isinstance(value, str) or not all(isinstance(item, str) for item in value):
                raise ValueError(f"{name} must be a list of strings, got {value!r}")
            object.__setattr__(self, name, tuple(value))  # frozen, so any sequence is kept as a tuple
        if self.root_path and not self.root_path.startswith("/"):
            raise ValueError(f"root_path must start with '/', got {self.root_path!r}")
        self._check_tls()
        unknown = set(self.engine_kwargs) - set(ENGINE_OPTIONS)
        if unknown:
            raise ValueError(f"unknown engine options: {sorted(unknown)}")

    def _one_or_more(self, name: str) -> None:
        """A name or key, or several (a list kept as a tuple; one alone kept as the string)."""
        value = getattr(self, name)
        if value is None or isinstance(value, str):
            return
        items = tuple(value)
        if not items or not all(isinstance(item, str) and item for item in items):
            raise ValueError(f"{name} must be a non-empty string or a list of them, got {value!r}")
        object.__setattr__(self, name, items[0] if len(items) == 1 else items)

    def served_model_names(self) -> tuple[str, ...]:
        """--served-model-name's names, the first being the one responses carry; () when not set."""
        return _as_tuple(self.served_model_name)

    def api_keys(self) -> tuple[str, ...]:
        """The keys a request may present; () when the API is open."""
        return _as_tuple(self.api_key)

    def _check_tls(self) -> None:
        """TLS settings that would otherwise fail late (in hypercorn, after the model started loading)
        or quietly serve plain HTTP: files that are missing, a key or CA without a certificate."""
        if self.ssl_cert_reqs not in (0, 1, 2):
            raise ValueError(f"ssl_cert_reqs must be 0 (none), 1 (optional) or 2 (required), "
                             f"got {self.ssl_cert_reqs!r}")
        for name in ("ssl_keyfile", "ssl_certfile", "ssl_ca_certs"):
            path = getattr(self, name)
            if path is not None and not os.path.isfile(path):
                raise ValueError(f"{name}: no such file {path!r}")
        if self.ssl_certfile is None:
            needing = [name for name in ("ssl_keyfile", "ssl_ca_certs", "ssl_ciphers") if getattr(self, name)]
            if self.ssl_cert_reqs:
                needing.append("ssl_cert_reqs")
            if needing:
                raise ValueError(f"{', '.join(needing)} without ssl_certfile: TLS needs a certificate")

    @classmethod
    def from_env(cls, environ: Optional[Mapping[str, str]] = None) -> "ServerConfig":
        env = os.environ if environ is None else environ
        own = {f.name: f.type for f in fields(cls) if f.name != "engine_kwargs"}
        values: dict[str, Any] = {}
        for name in own:
            raw = _get(env, name)
            if raw is not None:
                values[name] = _parse(name, raw, _FIELD_TYPES[name])
        engine_kwargs = {}
        for name, typ in ENGINE_OPTIONS.items():
            raw = _get(env, name)
            if raw is not None:
                engine_kwargs[name] = _parse(name, raw, typ)
        return cls(engine_kwargs=engine_kwargs, **values)

    def resolved_chat_template(self) -> Optional[str]:
        """``chat_template``'s text: the file's content when it names a file, else the value itself,
        which must then look like a template (vLLM's rule: a path or the template in one line)."""
        value = self.chat_template
        if value is None:
            return None
        if os.path.isfile(value):
            with open(value, encoding="utf-8") as f:
                return f.read()
        if "{{" in value or "{%" in value:
            return value
        raise ValueError(f"chat_template {value!r} is neither a file nor a Jinja template")

    def engine_arguments(self) -> dict[str, Any]:
        """Keyword arguments for ``Engine(**...)`` (model included)."""
        return {"model": self.model, **self.engine_kwargs}


def _as_tuple(value: Union[str, tuple[str, ...], None]) -> tuple[str, ...]:
    if not value:
        return ()
    return (value,) if isinstance(value, str) else tuple(value)


LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure_server_logging(level: int = logging.INFO) -> None:
    """Send the ``aioinfer`` loggers' lines (start-up phases, "engine ready", errors) to stderr
    while the process has configured no logging of its own.

    For ``hypercorn aioinfer.app:app``, where nothing else would: hypercorn configures its own
    loggers only, and Python drops the INFO records of loggers nobody configured. The handler
    steps aside whenever the root logger has handlers (``serve``'s ``basicConfig``, hypercorn's
    ``--log-config``, an application's setup, even one made after this call): the records then
    reach those, once. Does nothing if ``aioinfer`` already has a handler or a level. The request
    log (``aioinfer.requests``) has its own handler (request_log.configure_request_logger).
    """
    logger = logging.getLogger("aioinfer")
    if logger.handlers or logger.level != logging.NOTSET:
        return
    handler = _UnlessRootHandles(sys.stderr)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    logger.addHandler(handler)
    logger.setLevel(level)


class _UnlessRootHandles(logging.StreamHandler):
    """A StreamHandler that writes only while the root logger has no handler (see above)."""

    def emit(self, record: logging.LogRecord) -> None:
        if not logging.getLogger().handlers:
            super().emit(record)


_FIELD_TYPES: dict[str, type] = {
    "model": str, "served_model_name": str, "api_key": str, "max_body_bytes": int,
    "shutdown_grace": float, "max_n": int, "max_logprob_entries": int, "log_requests": bool, "listen_backlog": int,
    "enable_request_id_headers": bool, "enable_force_include_usage": bool, "enable_tokenizer_info_endpoint": bool,
    "return_tokens_as_token_ids": bool, "enforce_strict_tools": bool, "disable_additional_properties": bool,
    "chat_template": str,
    "allowed_origins": string_list_json, "allow_credentials": bool, "allowed_methods": string_list_json,
    "allowed_headers": string_list_json, "root_path": str, "ssl_keyfile": str, "ssl_certfile": str,
    "ssl_ca_certs": str, "ssl_cert_reqs": int, "ssl_ciphers": str, "enable_ssl_refresh": bool,
}


def env_name(option: str) -> str:
    return ENV_PREFIX + option.upper()


def _get(env: Mapping[str, str], name: str) -> Optional[str]:
    raw = env.get(env_name(name))
    if raw is None or raw.strip() == "":
        return None  # an empty variable means "not set", as shells make that easy to produce
    return raw.strip()


def _parse(name: str, raw: str, typ: type) -> Any:
    if typ not in (bool, int, float, str):  # a parser of its own (speculative_config_json), with its own message
        try:
            return typ(raw)
        except ValueError as exc:
            raise ValueError(f"{env_name(name)}: {exc}") from None
    try:
        if typ is bool:
            lowered = raw.lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if typ is int:
            return int(raw)
        if typ is float:
            return float(raw)
        return raw
    except ValueError:
        raise ValueError(f"{env_name(name)} must be {typ.__name__}, got {raw!r}") from None
