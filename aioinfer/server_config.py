"""Server settings: one frozen record, read from ``AIOINFER_*`` environment variables or CLI flags.

Every engine option of the offline ``LLM`` has one variable (``AIOINFER_MAX_MODEL_LEN`` for
``max_model_len``, ...); docs/server.md lists them all. A malformed value raises ``ValueError``
naming the variable, so ``hypercorn aioinfer.app:app`` fails at import with a clear message
instead of serving a misconfigured engine.

Each setting is declared once, as an option on the field that holds it (options.py): the server's
here, the engine config's in config.py, the async Engine's own keywords in ``AsyncEngineOptions``.
The variables are read from those declarations, and ``serve``'s flags built from them (option_flags.py).
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Union

from aioinfer.options import Spec, check_values, declared, option, read_env, string_list_json


@dataclass(frozen=True, slots=True)
class AsyncEngineOptions:
    """The async ``Engine``'s own keyword arguments, declared as options for the server's variables and
    flags. Never built: the Engine takes them as keywords, with its defaults and checks
    (async_engine/engine.py); None here means the Engine's default, which the help names
    (tests/entrypoints/test_options.py holds the two together)."""

    max_waiting_requests: Optional[int] = option(None, help="admission bound: queued requests before 429 "
                                                 "(default: 512)")
    max_waiting_prompt_tokens: Optional[int] = option(None, help="admission bound: queued prompt tokens before "
                                                      "429 (default: 262144)")
    stream_buffer_size: Optional[int] = option(None, help="deltas buffered per request before merging (default: 64)")
    stream_interval: Optional[int] = option(None, help="tokens per streamed chunk (1: every token at once; more: "
                                            "fewer chunks under load; default: 1)")
    stall_timeout: Optional[float] = option(None, help="seconds a stalled streaming client is kept before its "
                                            "request is aborted (default: 30)")
    host_cpu: Optional[int] = option(None, help="run the event loop's thread and the GPU thread on this one CPU "
                                     "(Linux; default: where the OS puts them)")
    fault_inject_step: Optional[int] = option(None, flag=False, help="tests only: the step loop fails at this step")


def engine_option_specs() -> tuple[Spec, ...]:
    """The options an engine of the server takes (``Engine(**engine_kwargs)``): the engine config's and
    the async Engine's own."""
    from aioinfer.config import engine_options

    return (*engine_options(), *declared(AsyncEngineOptions))


# Engine options (passed to Engine(**engine_kwargs)) and their parsers. None of them is set unless
# asked for, so the engine's own defaults stay the single source of truth.
ENGINE_OPTIONS: dict[str, Any] = {spec.name: spec.parse for spec in engine_option_specs()}


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """The server's settings, each declared as an option (its ``AIOINFER_*`` variable and ``serve`` flag),
    and the engine's options as given (``engine_kwargs``, see ENGINE_OPTIONS)."""

    # HF folder, .gguf file or hub id; None: the default model (fetched)
    model: Optional[str] = option(None, help="HF folder, .gguf file or hub id (default: SmolLM2-135M-Instruct)")
    # Name(s) in /v1/models, all accepted as a request's model; responses carry the first (vLLM's
    # --served-model-name takes several). None: engine.model_name
    served_model_name: Union[str, tuple[str, ...], None] = option(
        None, parse=str, multi=True, help="name(s) in /v1/models, each accepted as a request's model; responses "
        "carry the first (default: model basename)")
    # When set, every route but /health, /ready, /metrics needs 'Bearer <key>' with this key or one of
    # these (vLLM's --api-key takes several)
    api_key: Union[str, tuple[str, ...], None] = option(
        None, parse=str, multi=True, help="require 'Authorization: Bearer KEY' with this key, or one of these keys "
        "(not on /health, /ready, /metrics)")
    max_body_bytes: int = option(8 * 1024 * 1024, minimum=1, help="larger request bodies get 413")
    # seconds in-flight requests may run on after SIGTERM before being aborted
    shutdown_grace: float = option(10.0, minimum=0, help="seconds in-flight requests may finish after SIGTERM")
    # upper bound on `n` (each choice is a separate engine request)
    max_n: int = option(64, minimum=1, help="largest n accepted")
    # Most (token, logprob) entries one response may carry, prompt and output logprobs of every choice
    # together (SamplingParams.logprob_entries); more is a 400 before admission. An entry is ~80 bytes of
    # JSON and ~370 bytes of host memory at the peak of building the response: 2**20 is ~80 MB and ~0.4 GB.
    max_logprob_entries: int = option(1 << 20, minimum=1, help="most (token, logprob) entries one response may carry, "
                                      "prompt and output, all choices")
    # one JSON line per finished request on the "aioinfer.requests" logger
    log_requests: bool = option(True, disable_flag="--disable-log-requests", help="no per-request JSON log lines")
    # Connections the kernel queues for accept (0: leave the HTTP server's own, hypercorn's 100);
    # entrypoints/openai/listen_backlog.py says why 2048.
    listen_backlog: int = option(2048, minimum=0, help="connections queued for accept (0: hypercorn's 100)")
    # vLLM's switches of the same names (off by default, as there):
    # every response carries X-Request-Id (the client's, or a new one)
    enable_request_id_headers: bool = option(False, help="add X-Request-Id to every response (the client's, or a "
                                             "new one)")
    # every stream's chunks carry usage and a usage chunk ends it, whatever stream_options say (vLLM's)
    enable_force_include_usage: bool = option(False, help="usage on every chunk of every stream and a usage chunk "
                                              "at its end, as if stream_options asked for continuous_usage_stats")
    # GET /tokenizer_info (it shows the chat template)
    enable_tokenizer_info_endpoint: bool = option(False, help="serve GET /tokenizer_info (the tokenizer's config "
                                                  "and chat template)")
    # logprobs name tokens "token_id:<id>" unless a request says no
    return_tokens_as_token_ids: bool = option(False, help="logprobs name every token 'token_id:<id>' (a "
                                              "request's own field wins)")
    # Under tool_choice "auto", hold calls to strict functions to their schemas (tool_calls.py
    # strict_calls; vLLM's VLLM_ENFORCE_STRICT_TOOL_CALLING, off there too: such requests then take
    # the constrained path's cost at every step)
    enforce_strict_tools: bool = option(False, help="under tool_choice auto, hold calls to strict functions to "
                                        "their schemas")
    # vLLM's structured_outputs_config.disable_additional_properties, on by default (vLLM's default
    # backend, xgrammar, behaves so): in a request's JSON schemas, an object that lists its properties
    # takes no other keys unless it says additionalProperties: true; a request's own
    # structured_outputs.disable_additional_properties wins (structured_output/closed_objects.py)
    disable_additional_properties: bool = option(
        True, help="JSON schemas: an object that lists its properties takes no other keys unless it says "
        "additionalProperties: true (vLLM's default backend's rule; a request's "
        "structured_outputs.disable_additional_properties wins)")
    # vLLM's --chat-template: a Jinja file, or the template itself, used instead of the tokenizer's
    chat_template: Optional[str] = option(None, help="a Jinja file, or the template itself, instead of the "
                                          "tokenizer's (default: the tokenizer's)")
    # vLLM's CORS options, with the semantics of the Starlette middleware vLLM uses (cors.py): what a
    # page of another origin may send; "*" is any. No origins: CORS off (no page of another origin
    # can read a response or pass a preflight).
    allowed_origins: tuple[str, ...] = option(("*",), parse=string_list_json, help="origins whose pages may call "
                                              "the API, a JSON list; \"*\": any, []: CORS off (default: [\"*\"])")
    # cookies / Authorization from such pages (the Origin is echoed, never "*")
    allow_credentials: bool = option(False, help="CORS: pages of allowed origins may send cookies and "
                                     "Authorization (their origin is echoed instead of \"*\")")
    allowed_methods: tuple[str, ...] = option(("*",), parse=string_list_json, help="methods a preflight may ask "
                                              "for, a JSON list (default: [\"*\"], every method)")
    # request headers a preflight may ask for
    allowed_headers: tuple[str, ...] = option(("*",), parse=string_list_json, help="request headers a preflight "
                                              "may ask for, a JSON list (default: [\"*\"], any)")
    # vLLM's --root-path: the prefix a proxy serves the app under; requests work with it or without it
    root_path: Optional[str] = option(None, help="the path prefix a proxy serves the API under (/llm); requests "
                                      "may carry it or not (default: none)")
    # vLLM's TLS options (`serve` only: under plain hypercorn, its --certfile, --keyfile, --ca-certs, ...)
    ssl_keyfile: Optional[str] = option(None, help="PEM private key of --ssl-certfile (default: in the "
                                        "certificate file)")
    ssl_certfile: Optional[str] = option(None, help="PEM certificate chain: serve HTTPS (default: plain HTTP)")
    ssl_ca_certs: Optional[str] = option(None, help="PEM CA certificates that client certificates are checked "
                                         "against")
    # client certificates: 0 none, 1 optional, 2 required (Python's ssl.CERT_*)
    ssl_cert_reqs: int = option(0, minimum=0, maximum=2, help="client certificates: 0 not asked, 1 optional, 2 "
                                "required (Python's ssl.CERT_*)")
    # OpenSSL cipher list for TLS <= 1.2 (None: hypercorn's)
    ssl_ciphers: Optional[str] = option(None, help="OpenSSL cipher list for TLS 1.2 and below (default: "
                                        "hypercorn's)")
    # vLLM's --enable-ssl-refresh: the certificate, key and CA files are read again when they change
    # (entrypoints/ssl_refresh.py); no effect without ssl_certfile, as in vLLM
    enable_ssl_refresh: bool = option(False, help="read the --ssl-* files again when they change, for new "
                                      "connections (no restart)")
    engine_kwargs: dict[str, Any] = field(default_factory=dict)  # see ENGINE_OPTIONS

    def __post_init__(self) -> None:
        for name in ("served_model_name", "api_key"):
            self._one_or_more(name)
        check_values(self)
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
        return cls(engine_kwargs=read_env(engine_option_specs(), env), **read_env(declared(cls), env))

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
