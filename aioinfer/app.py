"""``hypercorn aioinfer.app:app``: the OpenAI-compatible server, configured from ``AIOINFER_*`` variables.

See docs/server.md for the variables. Importing this module builds the app and checks the settings
(entrypoints/startup_checks.py: the engine's options, the device, that the model exists) but loads
nothing: the engine starts in the ASGI lifespan. A bad setting, or a model that then fails to
load, ends the server with one ``aioinfer: error: ...`` line and a failing status, and a crash in
native code with a log line and a failing status (entrypoints/fatal_signals.py): hypercorn's main
process would otherwise exit 0 in all three cases.
"""

from aioinfer.entrypoints.fatal_signals import end_server, report_fatal_signals
from aioinfer.entrypoints.openai.api_server import create_app, get_state
from aioinfer.entrypoints.startup_checks import check_settings, failure_line, name_the_setting
from aioinfer.server_config import ServerConfig, configure_server_logging

PROG = "aioinfer"

report_fatal_signals()
configure_server_logging()  # hypercorn shows only its own loggers: without this, no start-up phases
try:
    _config = ServerConfig.from_env()
    check_settings(_config)
    app = create_app(_config)
except ValueError as _exc:
    end_server(2, f"{PROG}: error: {name_the_setting(str(_exc))}")


def _on_load_failure(exc: BaseException) -> None:
    # After a start, the engine's death is /health's to tell (an orchestrator restarts on it)
    if not get_state(app).engine_started:
        end_server(1, f"{PROG}: error: {failure_line(exc)}", now=True)


get_state(app).on_load_failure = _on_load_failure
