"""The server's engine and its lifecycle: loading in the background, ready, draining, stopped.

One task owns the engine: it enters ``async with Engine(...)``, waits for the stop signal and
exits, so the engine's task group is entered and left in the same task (anyio requires it).
The model loads in that task *after* the ASGI startup completed, so the server listens at once:
``/health`` answers 200 while loading (alive), ``/ready`` 503 until the warm-up step succeeded,
and a long first-start download cannot trip hypercorn's startup timeout.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from typing import Any, Optional

from aioinfer.entrypoints.openai.errors import APIError, model_not_found, not_ready, shutting_down
from aioinfer.entrypoints.openai.shutdown import OpenResponses, quiet_cancelled_connection_tasks
from aioinfer.metrics import PrometheusMetrics
from aioinfer.request_log import RequestLog, configure_request_logger
from aioinfer.server_config import ServerConfig
from aioinfer.utils.gc_deferral import apply_young_threshold

logger = logging.getLogger("aioinfer.server")


class ServerState:
    def __init__(self, config: ServerConfig, engine_factory=None) -> None:
        self.config = config
        self.chat_template = config.resolved_chat_template()  # --chat-template's text (None: the tokenizer's)
        self._engine_factory = engine_factory  # tests may inject one; default: aioinfer's Engine
        self.engine = None
        self.metrics: Optional[PrometheusMetrics] = None
        self.request_log = RequestLog()
        self.load_error: Optional[BaseException] = None
        self.engine_started = False  # the engine loaded and warmed up (a later error is no load failure)
        self.draining = False  # set on SIGTERM by `serve`: new requests get 503, running ones finish
        self._stop = asyncio.Event()
        self._owner: Optional[asyncio.Task] = None
        # Optional callback for an engine that fails to be built or to start (or later stops with an
        # error): the server commands exit with one line (entrypoints/startup_checks.py) instead of
        # idling dead. A start failure is then the callback's to report: its traceback is logged at DEBUG.
        self.on_load_failure = None
        self.responses = OpenResponses()  # the HTTP requests in flight, for the shutdown to end (shutdown.py)

    # ---------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Build the engine (bad settings fail startup loudly) and start loading it in the background."""
        configure_request_logger(self.config.log_requests)
        quiet_cancelled_connection_tasks(asyncio.get_running_loop())
        factory = self._engine_factory or _default_engine_factory
        observers = _Observers()
        try:
            # The metrics are labelled with the served name, which the engine knows before loading.
            self.engine = factory(observers=[observers], **self.config.engine_arguments())
        except Exception as exc:
            if self.on_load_failure is None:
                raise  # the ASGI start-up fails, as an embedder's server expects
            self._failed(exc)  # the server commands checked the settings already: this is a bug's path
            return
        self.metrics = PrometheusMetrics(self.served_model_name)
        observers.targets.append(self.metrics)
        if self.config.log_requests:
            observers.targets.append(self.request_log)
        self._stop = asyncio.Event()
        self._owner = asyncio.create_task(self._own_engine(), name="aioinfer-engine-owner")

    async def _own_engine(self) -> None:
        try:
            async with self.engine:
                self.engine_started = True
                tune_collector_for_serving()
                logger.info("engine ready: model %s, max_model_len %s", self.served_model_name,
                            self.engine.max_model_len)
                await self._stop.wait()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - reported through /health and the log
            self._failed(exc)

    def _failed(self, exc: BaseException) -> None:
        self.load_error = exc
        if self.on_load_failure is None or self.engine_started:
            logger.error("the engine failed to start or stopped with an error", exc_info=exc)
        else:  # the callback tells it in one line
            logger.debug("the engine failed to start", exc_info=exc)
        if self.on_load_failure is not None:
            self.on_load_failure(exc)

    async def stop(self) -> None:
        """Stop the engine: open requests are aborted and the GPU thread joined."""
        self.draining = True
        if self._owner is None:
            return
        self._stop.set()
        if self.engine is not None and not self.engine.is_ready and not self.engine.is_dead \
                and self.load_error is None:
            self._owner.cancel()  # still loading: there is nothing to drain
        try:
            await self._owner
        except asyncio.CancelledError:
            if asyncio.current_task().cancelling():
                raise
        self._owner = None

    # ---------------------------------------------------------------- per request

    @property
    def served_model_name(self) -> str:
        """The name responses carry: --served-model-name's first (vLLM's rule), else the model's."""
        names = self.config.served_model_names()
        if names:
            return names[0]
        return self.engine.model_name if self.engine is not None else "unknown"

    def served_model_names(self) -> list[str]:
        """The names /v1/models lists: every --served-model-name, or the model's own."""
        return list(self.config.served_model_names()) or [self.served_model_name]

    def model_aliases(self) -> set[str]:
        names = set(self.served_model_names())
        if self.engine is not None:
            names.add(self.engine.model_name)
        if self.config.model:
            names.add(self.config.model)
        return names

    def check_model(self, requested: Optional[str]) -> None:
        if requested is not None and requested not in self.model_aliases():
            raise model_not_found(requested)

    def ready_engine(self):
        """The engine, or the 503 that explains why it cannot take requests now."""
        engine = self.engine
        if self.is_dead:
            raise APIError(503, f"The engine is not running: {self._dead_reason()}", type="service_unavailable",
                           code="engine_dead")
        if engine is None or not engine.is_ready:
            raise not_ready()
        if self.draining:
            raise shutting_down()
        return engine

    @property
    def is_dead(self) -> bool:
        return self.load_error is not None or (self.engine is not None and self.engine.is_dead)

    @property
    def is_ready(self) -> bool:
        return self.engine is not None and self.engine.is_ready and not self.draining and not self.is_dead

    def model_defaults(self) -> dict:
        """Default sampling settings from generation_config.json, when the engine exposes them."""
        return dict(getattr(self.engine, "generation_defaults", None) or {})

    def _dead_reason(self) -> str:
        if self.load_error is not None:
            return f"failed to start ({type(self.load_error).__name__}: {self.load_error})"
        return "the step loop failed"


class _Observers:
    """Forwards engine events to observers that exist only once the engine was built."""

    def __init__(self) -> None:
        self.targets: list[Any] = []

    def on_step(self, stats) -> None:
        for target in self.targets:
            target.on_step(stats)

    def on_request_done(self, stats) -> None:
        for target in self.targets:
            target.on_request_done(stats)

    def on_rejected(self, reason: str) -> None:
        for target in self.targets:
            target.on_rejected(reason)

    def on_routed(self, engine_index: int, by_affinity: bool) -> None:  # data-parallel engines only
        for target in self.targets:
            if hasattr(target, "on_routed"):
                target.on_routed(engine_index, by_affinity)


def _default_engine_factory(**kwargs):
    from aioinfer.data_parallel.engine import create_engine

    return create_engine(**kwargs)  # an Engine, or a DataParallelEngine with data_parallel_size > 1


def tune_collector_for_serving() -> None:
    """Move everything alive once the engine is up (model, tokenizer, engine state: ~350k objects)
    out of the garbage collector's sight, as vLLM does after start-up; young collections at the
    interpreter's threshold unless ``AIOINFER_GC_YOUNG_THRESHOLD`` sets another (gc_deferral.py).

    A full collection traverses them all: 150-210 ms with the GIL held on a 2-core machine, which
    stalls the event loop and every GPU thread at once (the recurring slow run of
    benchmarks/probes/host_ceiling.py, gone with this). The server process is ours; an application that
    embeds ``Engine`` decides this for itself (``gc.freeze()`` is process-wide).
    """
    gc.collect()
    gc.freeze()
    apply_young_threshold()

