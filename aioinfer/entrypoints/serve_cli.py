"""``python -m aioinfer serve``: the OpenAI-compatible server under hypercorn, with vLLM's flag names.

Flags override the ``AIOINFER_*`` environment variables, which override the defaults. SIGINT or
SIGTERM starts a graceful shutdown: /ready turns 503 and new requests are refused at once,
in-flight requests get ``--shutdown-grace`` seconds to finish, then the rest are aborted and the
engine stops. A second signal is ignored (the shutdown is already bounded).

Boolean engine options are switches (``--enforce-eager`` / ``--no-enforce-eager``); left out, the
``AIOINFER_*`` variable or the default applies. Bad settings and a port in use stop ``serve``
before anything loads, with one ``aioinfer serve: error: ...`` line (status 2 for bad settings,
1 for a port that cannot be bound).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import errno
import faulthandler
import logging
import signal
import socket
import ssl
import sys
from typing import Any, NoReturn, Optional

from aioinfer.config import DTYPES, LOAD_FORMATS, PREEMPTION_MODES, is_valid_device
from aioinfer.server_config import (ENGINE_OPTIONS, LOG_FORMAT, ServerConfig, speculative_config_json,
                                    string_list_json)


def _string_list(value: str) -> tuple[str, ...]:
    try:
        return string_list_json(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


# flag -> (ServerConfig field or engine option, type, help)
_SERVER_FLAGS: dict[str, tuple[str, Any, str]] = {
    "--served-model-name": ("served_model_name", str, "name in /v1/models and responses (default: model basename)"),
    "--api-key": ("api_key", str, "require 'Authorization: Bearer KEY' (not on /health, /ready, /metrics)"),
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
# switch -> (ServerConfig field, help): --x / --no-x
_SERVER_SWITCHES: dict[str, tuple[str, str]] = {
    "--enable-request-id-headers": ("enable_request_id_headers",
                                    "add X-Request-Id to every response (the client's, or a new one)"),
    "--enable-force-include-usage": ("enable_force_include_usage",
                                     "end every stream with a usage chunk, as if stream_options.include_usage"),
    "--enable-tokenizer-info-endpoint": ("enable_tokenizer_info_endpoint",
                                         "serve GET /tokenizer_info (the tokenizer's config and chat template)"),
    "--return-tokens-as-token-ids": ("return_tokens_as_token_ids",
                                     "logprobs name every token 'token_id:<id>' (a request's own field wins)"),
    "--enforce-strict-tools": ("enforce_strict_tools",
                               "under tool_choice auto, hold calls to strict functions to their schemas"),
    "--allow-credentials": ("allow_credentials", "CORS: pages of allowed origins may send cookies and "
                                                 "Authorization (their origin is echoed instead of \"*\")"),
}
_ENGINE_HELP = {
    "max_model_len": "context length (default: the model's)",
    "max_logprobs": "most logprobs a request may ask for a position (-1: the whole vocabulary; default 20)",
    "max_num_seqs": "requests running at once",
    "max_num_batched_tokens": "tokens computed per step",
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
# Values argparse checks up front (status 2), from the engine config's own lists.
_ENGINE_CHOICES = {"dtype": DTYPES, "load_format": LOAD_FORMATS, "preemption_mode": PREEMPTION_MODES}
PROG = "aioinfer serve"


class _Switch(argparse.BooleanOptionalAction):
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


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    def _format_action_invocation(self, action: argparse.Action) -> str:
        if isinstance(action, _Switch):  # no value to show (nargs "?" exists only to refuse one)
            return ", ".join(action.option_strings)
        return super()._format_action_invocation(action)


def _device(value: str) -> str:
    if not is_valid_device(value):
        raise argparse.ArgumentTypeError(f"invalid device {value!r}: expected auto, cpu, cuda or cuda:N")
    return value


def _speculative_config(value: str) -> dict:
    try:
        return speculative_config_json(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _port(value: str) -> int:
    try:
        port = int(value)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"invalid port {value!r}: expected an integer from 0 to 65535")
    return port


# vLLM's spellings besides aioinfer's own.
_VLLM_FLAGS = {"tensor_parallel_size": ("-tp",), "data_parallel_size": ("-dp",), "swap_space_gib": ("--swap-space",)}
# Options whose values argparse checks with a parser of its own (a clear message, status 2).
_ARGUMENT_TYPES = {"device": _device, "speculative_config": _speculative_config}


def _with_default(text: Optional[str], option: str) -> Optional[str]:
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


def add_serve_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``serve`` subcommand to the main CLI; it sets ``func=run_serve``."""
    # A one-line usage: the full one lists every flag, and would bury the one-line error under it.
    parser = subparsers.add_parser("serve", help="run the OpenAI-compatible HTTP server", prog=PROG,
                                   usage="%(prog)s [MODEL] [options]  (all options: %(prog)s --help)",
                                   description=__doc__, formatter_class=_HelpFormatter)
    parser.add_argument("model_tag", nargs="?", default=None, metavar="MODEL",
                        help="the model, as vLLM takes it (`aioinfer serve MODEL`); same as --model")
    parser.add_argument("--model", default=None, help="HF folder, .gguf file or hub id (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--trust-remote-code", action=_Switch, default=None,
                        help="accepted for vLLM's command lines; no effect (no model code is ever downloaded)")
    parser.add_argument("--enable-auto-tool-choice", action=_Switch, default=None,
                        help="accepted for vLLM's command lines; no effect (tool calls are always parsed)")
    parser.add_argument("--tool-call-parser", choices=["hermes"], default=None,
                        help="accepted for vLLM's command lines: the one format parsed (Qwen2.5's <tool_call> JSON)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind (0.0.0.0 for all interfaces; default: %(default)s)")
    parser.add_argument("--port", type=_port, default=8000, help="default: %(default)s")
    for flag, (name, typ, text) in _SERVER_FLAGS.items():
        parser.add_argument(flag, type=typ, default=None, help=_with_default(text, name))
    for flag, (name, text) in _SERVER_SWITCHES.items():
        parser.add_argument(flag, dest=name, action=_Switch, default=None, help=_with_default(text, name))
    # default None everywhere: an absent flag leaves the AIOINFER_* variable (or the default) in force
    add_engine_flags(parser, default=None)
    parser.add_argument("--disable-log-requests", action="store_true", help="no per-request JSON log lines")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    parser.set_defaults(func=run_serve)
    return parser


def add_engine_flags(parser: argparse.ArgumentParser, default: Any = None) -> None:
    """The engine's options as flags (``--max-model-len``, vLLM's short forms, ``--x`` / ``--no-x``
    switches), each with ``default`` when absent (``argparse.SUPPRESS``: not in the namespace at all)."""
    for option, typ in ENGINE_OPTIONS.items():
        if option == "fault_inject_step":
            continue  # tests only (AIOINFER_FAULT_INJECT_STEP)
        flags = ["--" + option.replace("_", "-"), *_VLLM_FLAGS.get(option, ())]
        text = _with_default(_ENGINE_HELP.get(option), option)
        if typ is bool:
            parser.add_argument(*flags, dest=option, action=_Switch, default=default, help=text)
        else:
            parser.add_argument(*flags, dest=option, type=_ARGUMENT_TYPES.get(option, typ), default=default,
                                choices=_ENGINE_CHOICES.get(option), help=text)


def config_from_args(args: argparse.Namespace, environ=None) -> ServerConfig:
    config = ServerConfig.from_env(environ)
    changes: dict[str, Any] = {}
    model_tag = getattr(args, "model_tag", None)
    if model_tag is not None and args.model is not None and model_tag != args.model:
        raise ValueError(f"the model is given twice: {model_tag!r} and --model {args.model!r}")
    model = args.model if args.model is not None else model_tag
    if model is not None:
        changes["model"] = model
    for name in [name for name, _, _ in _SERVER_FLAGS.values()] + [name for name, _ in _SERVER_SWITCHES.values()]:
        if getattr(args, name, None) is not None:
            changes[name] = getattr(args, name)
    if args.disable_log_requests:
        changes["log_requests"] = False
    engine_kwargs = dict(config.engine_kwargs)
    engine_kwargs.update({k: getattr(args, k) for k in ENGINE_OPTIONS if getattr(args, k, None) is not None})
    return dataclasses.replace(config, engine_kwargs=engine_kwargs, **changes)


def run_serve(args: argparse.Namespace) -> None:
    """``serve``'s entry: settings and the port are checked before anything loads (see the module docstring)."""
    logging.basicConfig(level=args.log_level.upper(), format=LOG_FORMAT)
    try:
        config = config_from_args(args)  # malformed AIOINFER_* variables
        _check_engine_arguments(config)  # values argparse cannot check: the engine's own validation
        _check_tls(config)
    except ValueError as exc:
        _fail(str(exc), status=2)
    try:
        _check_port_free(args.host, args.port)
    except OSError as exc:
        _fail(_bind_error_message(exc, args.host, args.port), status=1)
    try:
        asyncio.run(serve(config, args.host, args.port))
    except OSError as exc:  # hypercorn's bind, if the port was taken since check_port_free
        if not _is_bind_error(exc):
            raise
        _fail(_bind_error_message(exc, args.host, args.port), status=1)


def _fail(message: str, status: int) -> NoReturn:
    """One line on stderr, argparse's style, and exit: no traceback for a user's mistake."""
    print(f"{PROG}: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(status)


def _check_engine_arguments(config: ServerConfig) -> None:
    """Build, without loading, the engine the server will build, and check that an explicit CUDA
    device exists: ValueError now, rather than a logged traceback after the port is open (the
    model loads in the background once the server listens)."""
    from aioinfer.data_parallel.engine import create_engine
    from aioinfer.engine.model_setup import resolve_device

    engine = create_engine(**config.engine_arguments())
    if engine.config.device != "auto":
        resolve_device(engine.config.device)


def _check_tls(config: ServerConfig) -> None:
    """Load the certificate and key as hypercorn will: a malformed PEM or a key that does not match
    the certificate is a one-line error now, not a traceback once the model is loading."""
    if config.ssl_certfile is None:
        return
    from hypercorn.config import Config

    try:
        _apply_tls(Config(), config).create_ssl_context()
    except (ssl.SSLError, OSError) as exc:
        raise ValueError(f"TLS: cannot use --ssl-certfile {config.ssl_certfile!r} / --ssl-keyfile "
                         f"{config.ssl_keyfile!r}: {exc}") from None


def _apply_tls(hconfig, config: ServerConfig):
    """vLLM's --ssl-* options as hypercorn's settings (hypercorn serves HTTPS once it has both a
    certificate and a key; a key inside the certificate file is read from there, as uvicorn does)."""
    if config.ssl_certfile is None:
        return hconfig
    hconfig.certfile = config.ssl_certfile
    hconfig.keyfile = config.ssl_keyfile or config.ssl_certfile
    hconfig.ca_certs = config.ssl_ca_certs
    hconfig.verify_mode = ssl.VerifyMode(config.ssl_cert_reqs)
    if config.ssl_ciphers:
        hconfig.ciphers = config.ssl_ciphers
    return hconfig


def _check_port_free(host: str, port: int) -> None:
    """Bind the address as hypercorn will (its own socket code), then let it go; OSError if it cannot.

    hypercorn binds only after the app's startup, which has already started loading the engine on
    its thread: a port in use found there leaves that thread to be killed at exit (an abort, not a
    clean status), so it is looked for first. The small window until hypercorn binds remains, and
    ``run_serve`` reports a bind error from there the same way.
    """
    from hypercorn.config import Config

    probe = Config()
    probe.bind = [_bind_address(host, port)]
    for sock in probe.create_sockets().insecure_sockets:
        sock.close()


def _bind_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"  # as serve() gives it to hypercorn


_BIND_ERRNOS = {errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES}


def _is_bind_error(exc: OSError) -> bool:
    return isinstance(exc, socket.gaierror) or exc.errno in _BIND_ERRNOS


def _bind_error_message(exc: OSError, host: str, port: int) -> str:
    if exc.errno == errno.EADDRINUSE:
        return f"port {port} on {host} is already in use"
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"cannot listen on {host}:{port}: {host} is not an address of this machine"
    if exc.errno == errno.EACCES:
        return f"cannot listen on {host}:{port}: permission denied (ports below 1024 need privileges)"
    return f"cannot listen on {host}:{port}: {exc.strerror or exc}"


async def serve(config: ServerConfig, host: str, port: int) -> None:
    """Serve until SIGINT/SIGTERM, then shut down gracefully (see the module docstring)."""
    from hypercorn.asyncio import serve as hypercorn_serve
    from hypercorn.config import Config

    from aioinfer.entrypoints.openai.api_server import create_app, get_state
    from aioinfer.entrypoints.openai.shutdown import FLUSH_SECONDS, end_after_grace

    faulthandler.enable(all_threads=True)  # a crash in native code leaves every thread's stack in the log
    app = create_app(config)
    state = get_state(app)
    hconfig = Config()
    hconfig.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    # The grace is ours (end_after_grace aborts what is still open when it ends, and the responses
    # end well); hypercorn's own timeout, after it, is only the backstop for a response that hangs.
    hconfig.graceful_timeout = config.shutdown_grace + FLUSH_SECONDS + 1
    hconfig.accesslog = None  # the app writes its own structured request log
    if config.listen_backlog:
        hconfig.backlog = config.listen_backlog  # under plain hypercorn the app raises it (listen_backlog.py)
    hconfig.errorlog = logging.getLogger("hypercorn.error")
    hconfig.root_path = config.root_path or ""  # the app accepts paths without it too (root_path.py)
    _apply_tls(hconfig, config)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    drain: list[asyncio.Task] = []  # owned here, awaited after hypercorn returns

    def on_signal(signum: int) -> None:
        if stop.is_set():
            return
        logging.getLogger("aioinfer.server").info(
            "%s: draining (up to %g s for in-flight requests)", signal.Signals(signum).name, config.shutdown_grace)
        state.draining = True  # new requests: 503; /ready: 503
        drain.append(loop.create_task(end_after_grace(state.responses, config.shutdown_grace),
                                      name="aioinfer-shutdown-grace"))
        stop.set()

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, on_signal, signum)
    state.on_load_failure = lambda exc: stop.set()  # a server that cannot load its model exits (status 1)
    try:
        await hypercorn_serve(app, hconfig, shutdown_trigger=stop.wait)
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
        for task in drain:
            task.cancel()  # done already, unless hypercorn's backstop ended the wait first
            await asyncio.gather(task, return_exceptions=True)
    if state.load_error is not None:
        raise SystemExit(1)


def main(argv: Optional[list[str]] = None) -> None:
    """Standalone entry point (``python -m aioinfer.entrypoints.serve_cli ...``)."""
    parser = argparse.ArgumentParser(prog="aioinfer")
    add_serve_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["serve", *(argv or [])] if argv is not None else None)
    args.func(args)


if __name__ == "__main__":
    main(sys.argv[1:])
