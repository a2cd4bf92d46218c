"""``hypercorn aioinfer.app:app``: the OpenAI-compatible server, configured from ``AIOINFER_*`` variables.

See docs/server.md for the variables. Importing this module builds the app (and validates the
settings) but loads nothing: the engine starts in the ASGI lifespan. A crash in native code ends
hypercorn with a failing status and a log line (entrypoints/fatal_signals.py).
"""

from aioinfer.entrypoints.fatal_signals import report_fatal_signals
from aioinfer.entrypoints.openai.api_server import create_app
from aioinfer.server_config import ServerConfig, configure_server_logging

report_fatal_signals()
configure_server_logging()  # hypercorn shows only its own loggers: without this, no start-up phases
app = create_app(ServerConfig.from_env())
