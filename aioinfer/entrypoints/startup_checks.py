"""What both server commands check before they listen, and how a failed start reads: one line that
names the setting (``AIOINFER_DTYPE``, ``--model``), never a traceback.

``hypercorn aioinfer.app:app`` runs the checks when its worker imports the app, ``python -m aioinfer
serve`` before it starts hypercorn; either way a bad setting stops the server before the port is
open. What cannot be checked up front (a hub download, the weights themselves) fails in the
background after the server listens, and is then told the same way, as the process exits
(entrypoints/fatal_signals.py ``end_server`` under hypercorn, serve_cli.py under ``serve``).
"""

from __future__ import annotations

import re
from typing import Collection

from aioinfer.option_flags import flags_of
from aioinfer.options import declared, env_name
from aioinfer.server_config import ServerConfig, engine_option_specs

# The settings a message may start with: ServerConfig's options (model included) and the engine's,
# each with the flag that sets it (its main one), where it has a flag.
_FLAGS = {spec.name: (flags_of(spec) or (None,))[0] for spec in (*declared(ServerConfig), *engine_option_specs())}
# A config error starts with the option's name (config.py's _check, ServerConfig's checks, the loader's
# "max_model_len ... exceeds"), then a space or a colon; a JSON option's with a dotted key
# (speculative_config.method), which no other name takes ("tokenizer.json ..." names a file).
_LEADING_NAME = re.compile(r"([a-z][a-z0-9_]*)(\.[a-z_]+)?(?=[ :])")
_JSON_OPTIONS = frozenset({"speculative_config", "kv_events_config"})


def check_settings(config: ServerConfig) -> None:
    """ValueError for a setting that would fail only once the model loads: the engine the server
    will build is built (its options validated, nothing loaded), an explicit CUDA device must
    exist, and the model must be a path that exists, a hub id or the default model's name."""
    from aioinfer.data_parallel.engine import create_engine
    from aioinfer.executor.model_setup import check_model_source, resolve_device

    engine = create_engine(**config.engine_arguments())
    if engine.config.device != "auto":
        resolve_device(engine.config.device)
    if config.model is not None:  # None: the default model, fetched at load
        check_model_source(config.model)


def name_the_setting(message: str, flags: Collection[str] = ()) -> str:
    """``message`` with its leading option name replaced by the setting the user wrote: ``--x-y``
    when ``x_y`` is in ``flags`` (given on ``serve``'s command line), else ``AIOINFER_X_Y``.
    ``"dtype must be one of ..."`` reads ``"AIOINFER_DTYPE must be one of ..."``; a message that
    starts with no option name is returned as it is."""
    match = _LEADING_NAME.match(message)
    if match is None or match.group(1) not in _FLAGS or (match.group(2) and match.group(1) not in _JSON_OPTIONS):
        return message
    name = match.group(1)
    setting = _FLAGS[name] if name in flags and _FLAGS[name] else env_name(name)
    return setting + message[match.end(1):]


def failure_line(exc: BaseException, flags: Collection[str] = (), *, started: bool = False) -> str:
    """One line for an engine that failed to start (``started``: that stopped with an error): the
    error's first line, naming the setting when it starts with one (a missing model, a hub id
    that cannot be fetched, a max_model_len too long for the model); otherwise its type too."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    first = lines[0] if lines else ""
    named = name_the_setting(first, flags)
    if named != first:
        return named
    what = "the engine stopped with an error" if started else "the engine failed to start"
    return f"{what}: {type(exc).__name__}" + (f": {first}" if first else "")
