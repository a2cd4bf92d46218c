"""``aioinfer serve``'s flags: the tables they are built from, vLLM's spellings of them, and the
argparse pieces (switches, value parsers) that give a bad value its one-line error (status 2).

Apart from serve_cli.py, which runs the server, because the flags are a concept of their own: what a
vLLM command line may say and what each flag means here. Three kinds:

- aioinfer's server settings and engine options (``ServerConfig`` fields, ``ENGINE_OPTIONS``), under
  vLLM's names where vLLM has the option (``--max-model-len``, ``-tp``, ``--served-model-name``);
- vLLM's engine options that change nothing here or that aioinfer refuses (``--enable-chunked-prefill``,
  ``--disable-log-stats``, ``--kv-cache-dtype``, ``--structured-outputs-config``, ...): flags built from
  vllm_options.py's tables, so that ``serve`` and ``LLM(...)`` accept and refuse the same values for
  the same reasons. They never reach the engine;
- vLLM's frontend flags for its HTTP server (``--uvicorn-log-level``), applied to hypercorn's.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
from typing import Any, Optional

from aioinfer.config import DTYPE_ALIASES, DTYPES, LOAD_FORMATS, PREEMPTION_MODES, is_valid_device
from aioinfer.server_config import ENGINE_OPTIONS, ServerConfig, speculative_config_json, string_list_json
from aioinfer.vllm_options import check_structured_outputs_config, refusal


def _string_list(value: str) -> tuple[str, ...]:
    try:
        return string_list_json(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


# flag -> (ServerConfig field or engine option, type, help)
SERVER_FLAGS: dict[str, tuple[str, Any, str]] = {
    "--served-model-name": ("served_model_name", str, "name(s) in /v1/models, each accepted as a request's "
                                                      "model; responses carry the first (default: model basename)"),
    "--api-key": ("api_key", str, "require 'Authorization: Bearer KEY' with this key, or one of these keys "
                                  "(not on /health, /ready, /metrics)"),
    "--max-body-bytes": ("max_body_bytes", int, "larger request bodies get 413"),
    "--shutdown-grace": ("shutdown_grace", float, "seconds in-flight requests may finish after SIGTERM"),
    "--max-n": ("max_n", int, "largest n accepted"),
    "--max-logprob-entries": ("max_logprob_entries", int, "most (token, logprob) entries one response may carry, "
                                                          "prompt and output, all choices (default: 1048576)"),
    "--listen-backlog": ("listen_backlog", int, "connections queued for accept (0: hypercorn's 100; default 2048)"),
    "--chat-template": ("chat_template", str, "a Jinja file, or the template itself, instead of the tokenizer's "
                                              "(default: the tokenizer's)"),
    # CORS, as vLLM's (JSON lists): what pages of other origins may send (entrypoints/openai/cors.py)
    "--allowed-origins": ("allowed_origins", _string_list, "origins whose pages may call the API, a JSON list; "
                                                           "\"*\": any, []: CORS off (default: [\"*\"])"),
    "--allowed-methods": ("allowed_methods", _string_list, "methods a preflight may ask for, a JSON list "
                                                           "(default: [\"*\"], every method)"),
    "--allowed-headers": ("allowed_headers", _string_list, "request headers a preflight may ask for, a JSON "
                                                           "list (default: [\"*\"], any)"),
    "--root-path": ("root_path", str, "the path prefix a proxy serves the API under (/llm); requests may carry "
                                      "it or not (default: none)"),
    "--ssl-certfile": ("ssl_certfile", str, "PEM certificate chain: serve HTTPS (default: plain HTTP)"),
    "--ssl-keyfile": ("ssl_keyfile", str, "PEM private key of --ssl-certfile (default: in the certificate file)"),
    "--ssl-ca-certs": ("ssl_ca_certs", str, "PEM CA certificates that client certificates are checked against"),
    "--ssl-cert-reqs": ("ssl_cert_reqs", int, "client certificates: 0 not asked, 1 optional, 2 required "
                                              "(Python's ssl.CERT_*; default: 0)"),
    "--ssl-ciphers": ("ssl_ciphers", str, "OpenSSL cipher list for TLS 1.2 and below (default: hypercorn's)"),
}
# vLLM's list options: one value or several after the flag (vLLM's nargs "+")
MULTI_VALUED = frozenset({"--served-model-name", "--api-key"})
# switch -> (ServerConfig field, help): --x / --no-x
SERVER_SWITCHES: dict[str, tuple[str, str]] = {
    "--enable-request-id-headers": ("enable_request_id_headers",
                                    "add X-Request-Id to every response (the client's, or a new one)"),
    "--enable-force-include-usage": ("enable_force_include_usage",
                                     "usage on every chunk of every stream and a usage chunk at its end, as if "
                                     "stream_options asked for continuous_usage_stats"),
    "--enable-tokenizer-info-endpoint": ("enable_tokenizer_info_endpoint",
                                         "serve GET /tokenizer_info (the tokenizer's config and chat template)"),
    "--return-tokens-as-token-ids": ("return_tokens_as_token_ids",
                                     "logprobs name every token 'token_id:<id>' (a request's own field wins)"),
    "--enforce-strict-tools": ("enforce_strict_tools",
                               "under tool_choice auto, hold calls to strict functions to their schemas"),
    "--disable-additional-properties": ("disable_additional_properties",
                                        "JSON schemas: an object that lists its properties takes no other keys "
                                        "unless it says additionalProperties: true (vLLM's default backend's "
                                        "rule; a request's structured_outputs.disable_additional_properties wins)"),
    "--allow-credentials": ("allow_credentials", "CORS: pages of allowed origins may send cookies and "
                                                 "Authorization (their origin is echoed instead of \"*\")"),
    "--enable-ssl-refresh": ("enable_ssl_refresh", "read the --ssl-* files again when they change, for new "
                                                   "connections (no restart)"),
}
_ENGINE_HELP = {
    "max_model_len": "context length; vLLM's suffixes: 2k = 2000, 32K = 32768 (default: the model's)",
    "max_logprobs": "most logprobs a request may ask for a position (-1: the whole vocabulary; default 20)",
    "max_num_seqs": "requests running at once",
    "max_num_batched_tokens": "tokens computed per step (2k = 2000, 8K = 8192)",
    "block_size": "tokens per KV block",
    "num_kv_blocks": "KV pool size in blocks (default: from memory)",
    "max_waiting_requests": "admission bound: queued requests before 429",
    "max_waiting_prompt_tokens": "admission bound: queued prompt tokens before 429",
    "stall_timeout": "seconds a stalled streaming client is kept before its request is aborted",
    "stream_interval": "tokens per streamed chunk (1: every token at once; more: fewer chunks under load)",
    "host_cpu": "run the event loop's thread and the GPU thread on this one CPU (Linux; default: where the OS puts them)",
    "data_parallel_size": "whole-model replicas, one GPU (and GPU thread) each, behind one router",
    "tensor_parallel_size": "ranks splitting each layer (one worker process per extra rank)",
    "preemption_mode": "recompute | swap (to pinned host memory)",
    "swap_space_gib": "pinned host memory for swapped-out KV blocks, GiB",
    "device": "auto (cuda when available, else cpu) | cpu | cuda | cuda:N",
    "cpu_threads": "CPU device: torch intra-op threads (default: torch's, at most the CPUs this process may use)",
    "enforce_eager": "no CUDA graphs (default: --no-enforce-eager, graphs on CUDA)",
    "async_scheduling": "schedule step N+1 before step N's results are back (default: on CUDA, off on CPU)",
    "enable_prefix_caching": "reuse KV blocks of equal prompt prefixes (default: on)",
    "speculative_config": "speculative decoding, vLLM's JSON: '{\"method\": \"ngram\", \"num_speculative_tokens\": 8}'",
    "structured_outputs_max_bytes": "largest structured-output constraint (schema, grammar, regex, choices) "
                                    "a request may carry, in bytes",
    "structured_outputs_compile_timeout": "seconds a request waits for its constraint to compile before a 400",
}
# Values argparse checks up front (status 2), from the engine config's own lists (vLLM's other
# spellings of a dtype included: half, float).
_ENGINE_CHOICES = {"dtype": (*DTYPES, *DTYPE_ALIASES), "load_format": LOAD_FORMATS,
                   "preemption_mode": PREEMPTION_MODES}

# vLLM's engine options that vllm_options.py accepts without effect or refuses, as flags:
# option -> (value type, short forms). bool: a --x / --no-x switch; str "json": vLLM's JSON argument.
VLLM_ENGINE_FLAGS: dict[str, tuple[Any, tuple[str, ...]]] = {
    "trust_remote_code": (bool, ()),
    "enable_chunked_prefill": (bool, ()),
    "disable_log_stats": (bool, ()),
    "disable_custom_all_reduce": (bool, ()),
    "enable_lora": (bool, ()),
    "skip_tokenizer_init": (bool, ()),
    "quantization": (str, ("-q",)),
    "kv_cache_dtype": (str, ()),
    "cpu_offload_gb": (float, ()),
    "pipeline_parallel_size": (int, ("-pp",)),
    "tokenizer_mode": (str, ()),
    "revision": (str, ()),
    "tokenizer_revision": (str, ()),
    "distributed_executor_backend": (str, ()),
    "download_dir": (str, ()),
    "scheduling_policy": (str, ()),
    "max_seq_len_to_capture": (int, ()),
    "reasoning_parser": (str, ()),
    "structured_outputs_config": (check_structured_outputs_config, ()),  # vLLM's JSON; also its dotted .backend
    "guided_decoding_backend": (str, ()),  # vLLM's older flag for the backend
}
_VLLM_ENGINE_HELP = {
    "trust_remote_code": "accepted for vLLM's command lines; no effect (no model code is ever downloaded)",
    "enable_chunked_prefill": "accepted; prefill is always chunked within the step's token budget "
                              "(--no-enable-chunked-prefill is refused)",
    "disable_log_stats": "accepted; no effect (no periodic stats lines are logged; /metrics is always served)",
    "structured_outputs_config": "vLLM's JSON, checked: backend auto or guidance (llguidance, the one here); "
                                 "its disable_additional_properties sets --[no-]disable-additional-properties",
    "guided_decoding_backend": "vLLM's older flag: auto or guidance (llguidance, the one here)",
    "reasoning_parser": "not implemented yet: refused",
    "quantization": "not implemented: refused (a quantized GGUF file loads, dequantized)",
    "kv_cache_dtype": "auto only (the KV cache is kept in the model's dtype)",
}
# vLLM's --uvicorn-log-level, applied to hypercorn's loggers (uvicorn's "trace" is below debug: debug)
UVICORN_LOG_LEVELS = {"critical": logging.CRITICAL, "error": logging.ERROR, "warning": logging.WARNING,
                      "info": logging.INFO, "debug": logging.DEBUG, "trace": logging.DEBUG}
HYPERCORN_LOGGERS = ("hypercorn.error", "hypercorn.access")


class Switch(argparse.BooleanOptionalAction):
    """``--x`` / ``--no-x``, vLLM's form of a boolean option, taking no value.

    It accepts an optional value only to refuse it: with a plain BooleanOptionalAction,
    ``--enforce-eager false`` would leave ``false`` to argparse as a stray word, reported as
    ``unrecognized arguments: false``; here it names the switch and the two ways to write it.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.nargs = "?"

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        if values is not None:
            raise argparse.ArgumentError(self, f"takes no value (got {values!r}): write {self.option_strings[0]} "
                                               f"or {self.option_strings[1]}")
        super().__call__(parser, namespace, None, option_string)


class _VLLMSwitch(Switch):
    """A switch for one of vLLM's engine options: the value aioinfer would not honour is refused at once
    with vllm_options.py's reason (``--no-enable-chunked-prefill``, ``--enable-lora``)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        super().__call__(parser, namespace, values, option_string)
        why = refusal(self.dest, getattr(namespace, self.dest))
        if why is not None:
            raise argparse.ArgumentError(self, f"{option_string} is not supported: {why}")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    def _format_action_invocation(self, action: argparse.Action) -> str:
        if isinstance(action, Switch):  # no value to show (nargs "?" exists only to refuse one)
            return ", ".join(action.option_strings)
        return super()._format_action_invocation(action)


def _checked(typ: Any, *, option: Optional[str] = None):
    """An argparse type from a parser raising ValueError (its message, not "invalid value"); with
    ``option``, the value is also held to vllm_options.py's rule for that vLLM option."""
    def parse(value: str) -> Any:
        try:
            parsed = typ(value)
        except ValueError as exc:
            message = f"invalid {typ.__name__} value: {value!r}" if typ in (int, float) else str(exc)
            raise argparse.ArgumentTypeError(message) from None
        why = refusal(option, parsed) if option is not None else None
        if why is not None:
            raise argparse.ArgumentTypeError(f"{value!r} is not supported: {why}")
        return parsed

    parse.__name__ = getattr(typ, "__name__", "value")
    return parse


def _device(value: str) -> str:
    if not is_valid_device(value):
        raise ValueError(f"invalid device {value!r}: expected auto, cpu, cuda or cuda:N")
    return value


def port(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = -1
    if not 0 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"invalid port {value!r}: expected an integer from 0 to 65535")
    return number


# vLLM's spellings besides aioinfer's own.
_VLLM_FLAGS = {"tensor_parallel_size": ("-tp",), "data_parallel_size": ("-dp",), "swap_space_gib": ("--swap-space",)}
# Options whose values argparse checks with a parser of its own (a clear message, status 2).
_ARGUMENT_TYPES = {"device": _device, "speculative_config": speculative_config_json}


def with_default(text: Optional[str], option: str) -> Optional[str]:
    """``text`` plus the option's default (the config dataclasses' own, so --help never drifts from
    them) unless the text already says it; flags default to None in argparse so that an absent flag
    leaves the AIOINFER_* variable in force, which is why argparse's %(default)s cannot say it."""
    default = _DEFAULTS.get(option)
    if default is None or (text and "default" in text):
        return text
    shown = default if not isinstance(default, bool) else ("on" if default else "off")
    return f"{text} (default: {shown})" if text else f"default: {shown}"


def _config_defaults() -> dict[str, Any]:
    from aioinfer.config import CacheConfig, EngineConfig, ModelConfig, ParallelConfig, SchedulerConfig

    defaults: dict[str, Any] = {}
    for cls in (ModelConfig, CacheConfig, SchedulerConfig, ParallelConfig, EngineConfig, ServerConfig):
        for f in dataclasses.fields(cls):
            if f.default is not dataclasses.MISSING:
                defaults[f.name] = f.default
    return defaults


_DEFAULTS = _config_defaults()


def add_server_flags(parser: argparse.ArgumentParser) -> None:
    """The server's settings (``ServerConfig``), each defaulting to None: absent, the AIOINFER_*
    variable (or the default) stays in force."""
    for flag, (name, typ, text) in SERVER_FLAGS.items():
        parser.add_argument(flag, type=typ, default=None, help=with_default(text, name),
                            nargs="+" if flag in MULTI_VALUED else None)
    for flag, (name, text) in SERVER_SWITCHES.items():
        parser.add_argument(flag, dest=name, action=Switch, default=None, help=with_default(text, name))
    parser.add_argument("--uvicorn-log-level", default=None, choices=list(UVICORN_LOG_LEVELS),
                        help="vLLM's: the level of the HTTP server's own log (hypercorn's here; default: "
                             "--log-level's)")


def add_engine_flags(parser: argparse.ArgumentParser, default: Any = None) -> None:
    """The engine's options as flags (``--max-model-len``, vLLM's short forms, ``--x`` / ``--no-x``
    switches), each with ``default`` when absent (``argparse.SUPPRESS``: not in the namespace at all);
    and vLLM's engine options that change nothing here or are refused (``VLLM_ENGINE_FLAGS``)."""
    for option, typ in ENGINE_OPTIONS.items():
        if option == "fault_inject_step":
            continue  # tests only (AIOINFER_FAULT_INJECT_STEP)
        flags = ["--" + option.replace("_", "-"), *_VLLM_FLAGS.get(option, ())]
        text = with_default(_ENGINE_HELP.get(option), option)
        if typ is bool:
            parser.add_argument(*flags, dest=option, action=Switch, default=default, help=text)
        else:
            typ = _ARGUMENT_TYPES.get(option, typ)
            parser.add_argument(*flags, dest=option, type=typ if typ in (int, float, str) else _checked(typ),
                                default=default, choices=_ENGINE_CHOICES.get(option), help=text)
    for option, (typ, short) in VLLM_ENGINE_FLAGS.items():
        flags = ["--" + option.replace("_", "-"), *short]
        text = _VLLM_ENGINE_HELP.get(option, "vLLM's; accepted only at the value that means what aioinfer does")
        if typ is bool:
            parser.add_argument(*flags, dest=option, action=_VLLMSwitch, default=default, help=text)
        elif typ in (int, float, str):
            parser.add_argument(*flags, dest=option, type=_checked(typ, option=option), default=default, help=text)
        else:  # a parser of its own, which checks too
            parser.add_argument(*flags, dest=option, type=_checked(typ), default=default, help=text)
    # vLLM's dotted form of one key of its JSON option (--structured-outputs-config.backend guidance)
    # (the older flag's option takes it: the same value, and LLM(**vars(args)) knows that name)
    parser.add_argument("--structured-outputs-config.backend", dest="guided_decoding_backend", default=default,
                        type=_checked(str, option="guided_decoding_backend"), help="auto or guidance")


def server_settings_of_vllm_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The server settings vLLM's engine flags carry: ``--structured-outputs-config``'s
    ``disable_additional_properties``, unless --[no-]disable-additional-properties says it itself."""
    config = getattr(args, "structured_outputs_config", None) or {}
    if "disable_additional_properties" in config and getattr(args, "disable_additional_properties", None) is None:
        return {"disable_additional_properties": config["disable_additional_properties"]}
    return {}


def apply_uvicorn_log_level(level: Optional[str]) -> None:
    """vLLM's --uvicorn-log-level for hypercorn's loggers (their records still go where --log-level's do)."""
    if level is not None:
        for name in HYPERCORN_LOGGERS:
            logging.getLogger(name).setLevel(UVICORN_LOG_LEVELS[level])
