"""``python -m aioinfer serve``: the OpenAI-compatible server under hypercorn, with vLLM's flag names.

Flags override the ``AIOINFER_*`` environment variables, which override the defaults. SIGINT or
SIGTERM starts a graceful shutdown: /ready turns 503 and new requests are refused at once,
in-flight requests get ``--shutdown-grace`` seconds to finish, then the rest are aborted and the
engine stops. A second signal is ignored (the shutdown is already bounded).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import signal
from typing import Any, Optional

from aioinfer.server_config import ENGINE_OPTIONS, ServerConfig

# flag -> (ServerConfig field or engine option, type, help)
_SERVER_FLAGS: dict[str, tuple[str, Any, str]] = {
    "--served-model-name": ("served_model_name", str, "name in /v1/models and responses (default: model basename)"),
    "--api-key": ("api_key", str, "require 'Authorization: Bearer KEY' (not on /health, /ready, /metrics)"),
    "--max-body-bytes": ("max_body_bytes", int, "larger request bodies get 413"),
    "--shutdown-grace": ("shutdown_grace", float, "seconds in-flight requests may finish after SIGTERM"),
    "--max-n": ("max_n", int, "largest n accepted"),
}
_ENGINE_HELP = {
    "max_model_len": "context length (default: the model's)",
    "max_num_seqs": "requests running at once",
    "max_num_batched_tokens": "tokens computed per step",
    "block_size": "tokens per KV block",
    "num_kv_blocks": "KV pool size in blocks (default: from memory)",
    "max_waiting_requests": "admission bound: queued requests before 429",
    "max_waiting_prompt_tokens": "admission bound: queued prompt tokens before 429",
    "stall_timeout": "seconds a stalled streaming client is kept before its request is aborted",
    "data_parallel_size": "whole-model replicas, one GPU (and GPU thread) each, behind one router",
    "tensor_parallel_size": "ranks splitting each layer (one worker process per extra rank)",
    "preemption_mode": "recompute | swap (to pinned host memory)",
    "swap_space_gib": "pinned host memory for swapped-out KV blocks, GiB",
}


def add_serve_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``serve`` subcommand to the main CLI; it sets ``func=run_serve``."""
    parser = subparsers.add_parser("serve", help="run the OpenAI-compatible HTTP server",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="HF folder, .gguf file or hub id (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (0.0.0.0 for all interfaces)")
    parser.add_argument("--port", type=int, default=8000)
    for flag, (_, typ, text) in _SERVER_FLAGS.items():
        parser.add_argument(flag, type=typ, default=None, help=text)
    for option, typ in ENGINE_OPTIONS.items():
        if option == "fault_inject_step":
            continue  # tests only (AIOINFER_FAULT_INJECT_STEP)
        parser.add_argument("--" + option.replace("_", "-"), dest=option, type=typ, default=None,
                            help=_ENGINE_HELP.get(option))
    parser.add_argument("--disable-log-requests", action="store_true", help="no per-request JSON log lines")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    parser.set_defaults(func=run_serve)
    return parser


def config_from_args(args: argparse.Namespace, environ=None) -> ServerConfig:
    config = ServerConfig.from_env(environ)
    changes: dict[str, Any] = {}
    if args.model is not None:
        changes["model"] = args.model
    for _, (name, _, _) in _SERVER_FLAGS.items():
        if getattr(args, name) is not None:
            changes[name] = getattr(args, name)
    if args.disable_log_requests:
        changes["log_requests"] = False
    engine_kwargs = dict(config.engine_kwargs)
    engine_kwargs.update({k: getattr(args, k) for k in ENGINE_OPTIONS if getattr(args, k, None) is not None})
    return dataclasses.replace(config, engine_kwargs=engine_kwargs, **changes)


def run_serve(args: argparse.Namespace) -> None:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = config_from_args(args)
    asyncio.run(serve(config, args.host, args.port))


async def serve(config: ServerConfig, host: str, port: int) -> None:
    """Serve until SIGINT/SIGTERM, then shut down gracefully (see the module docstring)."""
    from hypercorn.asyncio import serve as hypercorn_serve
    from hypercorn.config import Config

    from aioinfer.entrypoints.openai.api_server import create_app, get_state

    app = create_app(config)
    state = get_state(app)
    hconfig = Config()
    hconfig.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    hconfig.graceful_timeout = config.shutdown_grace  # in-flight requests' time to finish
    hconfig.accesslog = None  # the app writes its own structured request log
    hconfig.errorlog = logging.getLogger("hypercorn.error")

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal(signum: int) -> None:
        if stop.is_set():
            return
        logging.getLogger("aioinfer.server").info(
            "%s: draining (up to %g s for in-flight requests)", signal.Signals(signum).name, config.shutdown_grace)
        state.draining = True  # new requests: 503; /ready: 503
        stop.set()

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, on_signal, signum)
    state.on_load_failure = lambda exc: stop.set()  # a server that cannot load its model exits (status 1)
    try:
        await hypercorn_serve(app, hconfig, shutdown_trigger=stop.wait)
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
    if state.load_error is not None:
        raise SystemExit(1)


def main(argv: Optional[list[str]] = None) -> None:
    """Standalone entry point (``python -m aioinfer.entrypoints.serve_cli ...``)."""
    parser = argparse.ArgumentParser(prog="aioinfer")
    add_serve_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["serve", *(argv or [])] if argv is not None else None)
    args.func(args)


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
