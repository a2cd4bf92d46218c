"""``aioinfer serve``'s flags: the server's settings and the engine's options, vLLM's spellings of them,
and vLLM's frontend flags.

Apart from serve_cli.py, which runs the server, because the flags are a concept of their own: what a
vLLM command line may say and what each flag means here. Three kinds:

- aioinfer's server settings and engine options, built from their declarations (``ServerConfig``'s
  fields, the engine config's: option_flags.py), under vLLM's names where vLLM has the option
  (``--max-model-len``, ``-tp``, ``--served-model-name``);
- vLLM's engine options that change nothing here or that aioinfer refuses (``--enable-chunked-prefill``,
  ``--disable-log-stats``, ``--kv-cache-dtype``, ``--structured-outputs-config``, ...): flags built from
  vllm_options.py's tables, so that ``serve`` and ``LLM(...)`` accept and refuse the same values for
  the same reasons. They never reach the engine;
- vLLM's frontend flags for its HTTP server (``--uvicorn-log-level``), applied to hypercorn's;
- ``--ray`` and the Ray Serve deployment's settings (``--num-replicas``, ...: ray/options.py).
"""

from __future__ import annotations

import argparse
import logging
from typing import Any, Optional

from aioinfer.option_flags import HelpFormatter, Switch, add_engine_flags, add_flags
from aioinfer.options import declared
from aioinfer.ray.options import RayServeOptions
from aioinfer.server_config import ServerConfig
from aioinfer.vllm_options import VLLM_ENGINE_FLAGS

__all__ = ["HelpFormatter", "Switch", "VLLM_ENGINE_FLAGS", "add_engine_flags", "add_ray_flags", "add_server_flags",
           "apply_uvicorn_log_level", "port", "server_settings_of_vllm_flags"]

# vLLM's --uvicorn-log-level, applied to hypercorn's loggers (uvicorn's "trace" is below debug: debug)
UVICORN_LOG_LEVELS = {"critical": logging.CRITICAL, "error": logging.ERROR, "warning": logging.WARNING,
                      "info": logging.INFO, "debug": logging.DEBUG, "trace": logging.DEBUG}
HYPERCORN_LOGGERS = ("hypercorn.error", "hypercorn.access")


def port(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = -1
    if not 0 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"invalid port {value!r}: expected an integer from 0 to 65535")
    return number


def add_server_flags(parser: argparse.ArgumentParser) -> None:
    """The server's settings (``ServerConfig``'s declared options, ``--model`` included), each defaulting
    to None: absent, the AIOINFER_* variable (or the default) stays in force."""
    add_flags(parser, declared(ServerConfig), default=None)
    parser.add_argument("--uvicorn-log-level", default=None, choices=list(UVICORN_LOG_LEVELS),
                        help="vLLM's: the level of the HTTP server's own log (hypercorn's here; default: "
                             "--log-level's)")


def add_ray_flags(parser: argparse.ArgumentParser) -> None:
    """``--ray`` and the Ray Serve deployment's settings (ray/options.py), each defaulting to None."""
    add_flags(parser, declared(RayServeOptions), default=None)


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
