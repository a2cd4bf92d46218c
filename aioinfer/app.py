"""``hypercorn aioinfer.app:app``: the OpenAI-compatible server, configured from ``AIOINFER_*`` variables.

See docs/server.md for the variables. Importing this module builds the app (and validates the
settings) but loads nothing: the engine starts in the ASGI lifespan.
"""

from aioinfer.entrypoints.openai.api_server import create_app
from aioinfer.server_config import ServerConfig, configure_server_logging

configure_server_logging()  # hypercorn shows only its own loggers: without this, no start-up phases
app = create_app(ServerConfig.from_env())
