"""The Quart app: routes, API-key check, JSON error handlers, engine lifespan.

``create_app(config)`` builds one independent app (its own engine, metrics registry and state),
so that tests and embedders can run several in one process; ``aioinfer.app:app`` is the one
built from the environment.
"""

from __future__ import annotations

import hmac
import math
import logging
import time
import uuid
from typing import Optional

from quart import Quart, request
from werkzeug.exceptions import HTTPException

from aioinfer.version import __version__
from aioinfer.entrypoints.openai.body_limit import BODY_ERROR, TOO_LARGE, BodyLimit
from aioinfer.entrypoints.openai.content_type import require_json
from aioinfer.entrypoints.openai.cors import CORSPolicy, install_cors
from aioinfer.entrypoints.openai.errors import APIError, request_timeout, request_too_large, unauthorized
from aioinfer.entrypoints.openai.listen_backlog import raise_backlog_once_listening
from aioinfer.entrypoints.openai.root_path import RootPath
from aioinfer.entrypoints.openai.server_state import ServerState
from aioinfer.entrypoints.openai.shutdown import EndOpenResponses
from aioinfer.entrypoints.openai.serving_chat import create_chat_completion
from aioinfer.entrypoints.openai.serving_completions import create_completion
from aioinfer.entrypoints.openai.serving_responses import create_response
from aioinfer.entrypoints.openai.serving_tokens import detokenize, tokenize, tokenizer_info
from aioinfer.entrypoints.openai.sse import json_response
from aioinfer.metrics import CONTENT_TYPE
from aioinfer.server_config import ServerConfig

logger = logging.getLogger("aioinfer.server")

# Probes and scrapes must work without credentials (load balancers, Prometheus).
OPEN_PATHS = frozenset({"/health", "/ready", "/metrics"})
STATE_KEY = "aioinfer"
REQUEST_START = "aioinfer.request_start"  # request.scope key: time.perf_counter() when the request began
# RFC 6750: a 401 names the scheme the client must use.
WWW_AUTHENTICATE = 'Bearer realm="aioinfer"'


def create_app(config: Optional[ServerConfig] = None, engine_factory=None) -> Quart:
    config = config or ServerConfig.from_env()
    app = Quart("aioinfer")
    app.config["MAX_CONTENT_LENGTH"] = config.max_body_bytes  # larger bodies: 413 (BodyLimit decides first)
    app.config["RESPONSE_TIMEOUT"] = None  # streams last as long as generation does
    app.config["BODY_TIMEOUT"] = 60  # seconds to receive a request body
    # Bodies are read whole before a route runs, so that no answer (413 above all) is lost to a reset.
    app.asgi_app = BodyLimit(app.asgi_app, config.max_body_bytes, timeout=app.config["BODY_TIMEOUT"])
    state = ServerState(config, engine_factory)
    # Requests still open when the server's graceful timeout ends end well, not cut (shutdown.py).
    app.asgi_app = EndOpenResponses(app.asgi_app, state.responses)  # type: ignore[method-assign]
    app.asgi_app = RootPath(app.asgi_app, config.root_path)  # with or without the proxy's prefix (root_path.py)
    app.extensions[STATE_KEY] = state
    started = int(time.time())
    # vLLM's --api-key takes several keys: any of them opens the API
    expected_auth = [f"Bearer {key}".encode() for key in config.api_keys()]

    @app.before_serving
    async def _start() -> None:
        if config.listen_backlog:
            raise_backlog_once_listening(config.listen_backlog)
        await state.start()

    @app.after_serving
    async def _stop() -> None:
        await state.stop()

    @app.before_request
    async def _start_clock():  # first, so that every response has its duration (metrics' HTTP histogram)
        request.scope[REQUEST_START] = time.perf_counter()

    @app.before_request
    async def _body_verdict():
        error = request.scope.get(BODY_ERROR)  # BodyLimit's verdict on a body it did not hand on
        if error == TOO_LARGE:
            raise request_too_large(config.max_body_bytes)
        if error is not None:
            raise request_timeout(app.config["BODY_TIMEOUT"])

    install_cors(app, CORSPolicy.from_config(config))  # here: preflights are answered before the API-key check

    @app.before_request
    async def _authenticate():
        if not expected_auth or request.path in OPEN_PATHS:
            return None
        given = request.headers.get("Authorization", "").encode()
        # every key compared, so that the time taken does not tell which one was close
        if not sum(hmac.compare_digest(given, expected) for expected in expected_auth):
            raise unauthorized()
        return None

    @app.after_request
    async def _account(response):
        # vLLM's switch: every response carries the client's id back, or a new one (without it only the
        # generation routes send X-Request-Id: their response's id, serving_common.admit_and_respond).
        if config.enable_request_id_headers:
            response.headers["X-Request-Id"] = request.headers.get("X-Request-Id") or uuid.uuid4().hex
        if state.metrics is not None:
            route = request.url_rule.rule if request.url_rule is not None else "unmatched"
            start = request.scope.get(REQUEST_START)
            state.metrics.observe_http(route, response.status_code, request.method,
                                       None if start is None else time.perf_counter() - start)
        if response.status_code >= 400 and request.path not in OPEN_PATHS:  # probes would flood the log
            state.request_log.log_http_error(
                request_id=request.headers.get("X-Request-Id"), method=request.method, path=request.path,
                status=response.status_code, code=getattr(response, "error_code", None))
        return response

    @app.errorhandler(APIError)
    async def _api_error(exc: APIError):
        return _error_response(exc)

    @app.errorhandler(HTTPException)
    async def _http_error(exc: HTTPException):
        if exc.code == 413:  # Quart's own limit, a backstop behind BodyLimit
            return _error_response(request_too_large(config.max_body_bytes))
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.code, "http_error")
        return _error_response(APIError(exc.code or 400, exc.description or exc.name, code=code))

    @app.errorhandler(Exception)
    async def _unexpected(exc: Exception):
        logger.exception("unhandled error on %r %r", request.method, request.path)  # client strings: escaped
        return _error_response(APIError(500, f"Internal server error ({type(exc).__name__})", type="server_error",
                                        code="internal_error"))

    # ------------------------------------------------------------------ OpenAI routes

    async def json_body() -> bytes:
        require_json(request.headers.get("Content-Type"))  # 415 otherwise
        return await request.get_data(cache=False)

    @app.post("/v1/completions")
    async def completions():
        body = await json_body()
        return await create_completion(state, body, request.headers.get("X-Request-Id"))

    @app.post("/v1/chat/completions")
    async def chat_completions():
        body = await json_body()
        return await create_chat_completion(state, body, request.headers.get("X-Request-Id"))

    @app.post("/v1/responses")
    async def responses():
        body = await json_body()
        return await create_response(state, body, request.headers.get("X-Request-Id"))

    @app.get("/v1/models")
    async def models():
        engine = state.engine
        root = config.model or (engine.model_name if engine is not None else None)
        cards = [{"id": name, "object": "model", "created": started, "owned_by": "aioinfer", "root": root,
                  "parent": None} for name in state.served_model_names()]  # one per served name, as vLLM's
        if engine is not None and engine.is_ready:
            for card in cards:
                card["max_model_len"] = engine.max_model_len
                # the formats the model is served in (not in vLLM's cards; extra keys clients ignore)
                card["quantization"] = engine.quantization
                card["kv_cache_dtype"] = engine.config.cache.kv_cache_dtype
        return json_response({"object": "list", "data": cards})

    @app.post("/tokenize")
    async def tokenize_route():
        return json_response(tokenize(state, await json_body()))

    @app.post("/detokenize")
    async def detokenize_route():
        return json_response(detokenize(state, await json_body()))

    if config.enable_tokenizer_info_endpoint:  # off by default, as vLLM's: it shows the chat template
        @app.get("/tokenizer_info")
        async def tokenizer_info_route():
            return json_response(tokenizer_info(state))

    # ------------------------------------------------------------------ operations

    @app.get("/version")
    async def version():
        return json_response({"version": __version__})

    @app.get("/health")
    async def health():
        # Liveness: alive while loading; 503 once the engine died (restart me).
        if state.is_dead:
            return json_response({"status": "dead"}, status=503)
        return json_response({"status": "ok"})

    @app.get("/ready")
    async def ready():
        if state.is_ready:
            return json_response({"status": "ready"})
        status = "dead" if state.is_dead else "draining" if state.draining else "loading"
        return json_response({"status": status}, status=503)

    @app.get("/metrics")
    async def metrics():
        if state.metrics is None:
            return json_response({"status": "starting"}, status=503)
        if state.engine is not None and (state.engine.is_ready or state.engine.is_dead):
            state.metrics.refresh(state.engine.stats())  # a dead engine runs nothing: its gauges read 0
        return state.metrics.render(), 200, {"Content-Type": CONTENT_TYPE}

    return app


def _error_response(exc: APIError):
    headers = {}
    if exc.retry_after is not None:
        headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after)))  # whole seconds, never early
    if exc.status == 401:
        headers["WWW-Authenticate"] = WWW_AUTHENTICATE
    response = json_response(exc.body(), status=exc.status, headers=headers)
    response.error_code = exc.code  # type: ignore[attr-defined] - for the request log
    return response


def get_state(app: Quart) -> ServerState:
    return app.extensions[STATE_KEY]
