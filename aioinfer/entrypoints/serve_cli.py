"""``python -m aioinfer serve``: the OpenAI-compatible server under hypercorn, with vLLM's flag names.

Flags override the ``AIOINFER_*`` environment variables, which override the defaults. SIGINT or
SIGTERM starts a graceful shutdown: /ready turns 503 and new requests are refused at once,
in-flight requests get ``--shutdown-grace`` seconds to finish, then the rest are aborted and the
engine stops. A second signal is ignored (the shutdown is already bounded).

Boolean engine options are switches (``--enforce-eager`` / ``--no-enforce-eager``); left out, the
``AIOINFER_*`` variable or the default applies. Bad settings (a model path that does not exist
included) and a port in use stop ``serve`` before anything loads, with one ``aioinfer serve: error:
...`` line naming the flag or variable (status 2 for bad settings, 1 for a port that cannot be
bound); a model that fails to load once the server listens (a hub id that cannot be fetched) ends
it with such a line and status 1 (entrypoints/startup_checks.py).

vLLM's flags that change nothing here are accepted, so that a vLLM command line runs as it is; one
whose value would change the result but is not implemented here is refused with the reason
(entrypoints/serve_flags.py has the flags, docs/vllm_compatibility.md the table).

``--ray`` serves through Ray Serve instead: engine replicas in Ray actors (``--num-replicas``, or
``--max-replicas`` to autoscale) behind the same routes, prefix-aware routing between them
(entrypoints/ray_app.py, docs/scaling.md); it needs ``pip install 'aioinfer[ray]'``.
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
from typing import Any, Collection, NoReturn, Optional

from aioinfer.entrypoints.serve_flags import (HelpFormatter, Switch, add_engine_flags, add_ray_flags,
                                             add_server_flags, apply_uvicorn_log_level, port,
                                             server_settings_of_vllm_flags)
from aioinfer.entrypoints.startup_checks import check_settings, failure_line, name_the_setting
from aioinfer.options import declared
from aioinfer.ray.options import RayServeOptions
from aioinfer.server_config import ENGINE_OPTIONS, LOG_FORMAT, ServerConfig

__all__ = ["add_engine_flags", "add_serve_parser", "config_from_args", "ray_options_from_args", "run_serve",
           "serve"]
PROG = "aioinfer serve"


def add_serve_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``serve`` subcommand to the main CLI; it sets ``func=run_serve``."""
    # A one-line usage: the full one lists every flag, and would bury the one-line error under it.
    parser = subparsers.add_parser("serve", help="run the OpenAI-compatible HTTP server", prog=PROG,
                                   usage="%(prog)s [MODEL] [options]  (all options: %(prog)s --help)",
                                   description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("model_tag", nargs="?", default=None, metavar="MODEL",
                        help="the model, as vLLM takes it (`aioinfer serve MODEL`); same as --model")
    parser.add_argument("--enable-auto-tool-choice", action=Switch, default=None,
                        help="accepted for vLLM's command lines; no effect (tool calls are always parsed)")
    parser.add_argument("--tool-call-parser", choices=["hermes", "llama3_json"], default=None,
                        help="accepted for vLLM's command lines: both formats are always parsed (Qwen2.5's "
                             "<tool_call> JSON, Llama 3.x's JSON calls)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind (0.0.0.0 for all interfaces; default: %(default)s)")
    parser.add_argument("--port", type=port, default=8000, help="default: %(default)s")
    # default None everywhere: an absent flag leaves the AIOINFER_* variable (or the default) in force
    add_server_flags(parser)
    add_engine_flags(parser, default=None)
    add_ray_flags(parser)
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    parser.set_defaults(func=run_serve)
    return parser


def config_from_args(args: argparse.Namespace, environ=None) -> ServerConfig:
    config = ServerConfig.from_env(environ)
    changes: dict[str, Any] = {}
    model_tag = getattr(args, "model_tag", None)
    if model_tag is not None and args.model is not None and model_tag != args.model:
        raise ValueError(f"the model is given twice: {model_tag!r} and --model {args.model!r}")
    model = args.model if args.model is not None else model_tag
    if model is not None:
        changes["model"] = model
    for spec in declared(ServerConfig):
        if spec.name != "model" and getattr(args, spec.name, None) is not None:
            changes[spec.name] = getattr(args, spec.name)
    changes.update(server_settings_of_vllm_flags(args))
    engine_kwargs = dict(config.engine_kwargs)
    engine_kwargs.update({k: getattr(args, k) for k in ENGINE_OPTIONS if getattr(args, k, None) is not None})
    return dataclasses.replace(config, engine_kwargs=engine_kwargs, **changes)


def ray_options_from_args(args: argparse.Namespace, environ=None) -> RayServeOptions:
    """``--ray`` and the deployment's settings: flags over ``AIOINFER_*`` variables over the defaults."""
    changes = {spec.name: getattr(args, spec.name) for spec in declared(RayServeOptions)
               if getattr(args, spec.name, None) is not None}
    return dataclasses.replace(RayServeOptions.from_env(environ), **changes)


def run_serve(args: argparse.Namespace) -> None:
    """``serve``'s entry: settings and the port are checked before anything loads (see the module docstring)."""
    logging.basicConfig(level=args.log_level.upper(), format=LOG_FORMAT)
    apply_uvicorn_log_level(args.uvicorn_log_level)
    try:
        config = config_from_args(args)  # malformed AIOINFER_* variables
        ray_options = ray_options_from_args(args)
        if ray_options.ray:
            _check_ray_installed()
            _check_ray_settings(config, ray_options)
        else:
            _check_engine_arguments(config)  # values argparse cannot check: the engine's own validation
        _check_tls(config)
    except ValueError as exc:
        _fail(name_the_setting(str(exc), _flags_given(args)), status=2)
    if config.enable_ssl_refresh and not config.ssl_certfile:  # vLLM ignores it then too
        logging.getLogger("aioinfer.server").warning("--enable-ssl-refresh without --ssl-certfile: nothing to refresh")
    try:
        _check_port_free(args.host, args.port)
    except OSError as exc:
        _fail(_bind_error_message(exc, args.host, args.port), status=1)
    if ray_options.ray:
        from aioinfer.entrypoints.ray_app import run_with_ray

        try:
            run_with_ray(config, ray_options, args.host, args.port)
        except ValueError as exc:  # the replicas do not fit the local Ray cluster
            _fail(str(exc), status=2)
        return
    try:
        asyncio.run(serve(config, args.host, args.port, flags=_flags_given(args)))
    except OSError as exc:  # hypercorn's bind, if the port was taken since check_port_free
        if not _is_bind_error(exc):
            raise
        _fail(_bind_error_message(exc, args.host, args.port), status=1)


def _fail(message: str, status: int) -> NoReturn:
    """One line on stderr, argparse's style, and exit: no traceback for a user's mistake."""
    print(f"{PROG}: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(status)


def _check_engine_arguments(config: ServerConfig) -> None:
    """ValueError now, rather than a failure after the port is open (the model loads in the
    background once the server listens): startup_checks.check_settings."""
    check_settings(config)


def _check_ray_installed() -> None:
    import importlib

    try:
        importlib.import_module("ray.serve")
    except ImportError:
        _fail("--ray needs Ray Serve, which is not installed: pip install 'aioinfer[ray]'", status=2)


def _check_ray_settings(config: ServerConfig, options: RayServeOptions) -> None:
    """The engine's options as the replicas take them; with a local Ray (no --ray-address), all of
    ``serve``'s checks too: the device and the model path are this machine's. A cluster's are its own."""
    from aioinfer.entrypoints.ray_app import engine_config_of

    engine_config_of(config)
    hypercorn_only = [name for name in ("ssl_cert_reqs", "ssl_ciphers", "enable_ssl_refresh")
                      if getattr(config, name)]
    if hypercorn_only:
        raise ValueError(f"{hypercorn_only[0]} is not supported with --ray: Ray's HTTP proxy serves TLS with the "
                         f"certificate, key and CA files only")
    if options.ray_address is None:
        check_settings(config)


def _flags_given(args: argparse.Namespace) -> frozenset[str]:
    """The settings given as flags, by option name (the others came from AIOINFER_* variables)."""
    given = {name for name, value in vars(args).items() if value is not None}
    return frozenset(given | ({"model"} if getattr(args, "model_tag", None) is not None else set()))


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


async def serve(config: ServerConfig, host: str, port: int, flags: Collection[str] = ()) -> None:
    """Serve until SIGINT/SIGTERM, then shut down gracefully (see the module docstring). ``flags``:
    the settings given as flags, for the line that names one when the engine fails to start."""
    from hypercorn.asyncio import serve as hypercorn_serve

    from aioinfer.entrypoints.openai.api_server import create_app, get_state
    from aioinfer.entrypoints.openai.shutdown import FLUSH_SECONDS, end_after_grace
    from aioinfer.entrypoints.ssl_refresh import TLSConfig, refresh_certificates

    faulthandler.enable(all_threads=True)  # a crash in native code leaves every thread's stack in the log
    app = create_app(config)
    state = get_state(app)
    hconfig = TLSConfig()  # hypercorn's Config, keeping its SSLContext for --enable-ssl-refresh
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
    drain: list[asyncio.Task] = []  # owned here, cancelled and awaited after hypercorn returns

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
    if config.enable_ssl_refresh and config.ssl_certfile:  # owned here like drain's, cancelled at the end
        drain.append(loop.create_task(refresh_certificates(hconfig, config.ssl_certfile, config.ssl_keyfile,
                                                           config.ssl_ca_certs), name="aioinfer-ssl-refresh"))
    try:
        await hypercorn_serve(app, hconfig, shutdown_trigger=stop.wait)
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
        for task in drain:
            task.cancel()  # the grace: done already, unless hypercorn's backstop ended the wait first
            await asyncio.gather(task, return_exceptions=True)
    if state.load_error is not None:
        _fail(failure_line(state.load_error, flags, started=state.engine_started), status=1)


def main(argv: Optional[list[str]] = None) -> None:
    """Standalone entry point (``python -m aioinfer.entrypoints.serve_cli ...``)."""
    parser = argparse.ArgumentParser(prog="aioinfer")
    add_serve_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["serve", *(argv or [])] if argv is not None else None)
    args.func(args)


if __name__ == "__main__":
    main(sys.argv[1:])
