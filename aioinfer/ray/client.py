"""``RayEngine``: the engine interface the server's routes use, over a Ray Serve deployment of
``EngineReplica``s, so that the whole Quart app (routes, errors, auth, 429s, SSE) runs unchanged as
the ingress of many engine processes.

What stays in the ingress: the tokenizer (loaded from the same model files as the replicas, without
the weights), so that chat templates, ``/tokenize``, prompt checks and the route key cost no round
trip; the checks ``Engine.generate`` makes before it admits (the input processor's, reused); and
the routing key (routing.py ``prefix_route_key``), which Ray's request router reads from the call's
``route_key`` keyword. What the replica decides: admission (its queue bounds, the context and KV
limits), reported as the stream's first item (stream.py ``RayStream.admitted``).

Health: ready while at least one replica answers (Ray replaces dead ones; a request that met a dead
one before admission is retried on another). Never dead: a replica's death is Ray's to repair, and
a 503 from ``/health`` would only make a supervisor restart the ingress, which cannot help.

Figures: ``stats()`` and the metrics observers read the replicas' figures, refreshed about once a
second in the background (figures.py); each request's record (its TTFT, inter-token times) is the
replica engine's own, sent with its last delta. Slow clients: the replicas always read their
engines' output at once (Ray buffers it), so the stall limit is applied here, to the HTTP
connection's probe, as ``Engine`` applies it (``stall_timeout``).
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import time
from typing import Any, Optional, Sequence

import anyio

from aioinfer.async_engine.engine import Engine, Prompt, checked_request_id
from aioinfer.async_engine.stats import EngineObserver, RequestStats, call_observer
from aioinfer.config import EngineConfig
from aioinfer.engine.input_processor import InputProcessor, prompt_salt
from aioinfer.errors import AdmissionLimitExceeded, EngineNotReady, EngineOverloaded, SlowConsumerError
from aioinfer.ray.directory import ReplicaDirectory
from aioinfer.ray.figures import ReplicaFigures
from aioinfer.ray.routing import prefix_route_key
from aioinfer.ray.stream import RayStream
from aioinfer.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

_ENGINE_SIGNATURE = inspect.signature(Engine.__init__).parameters
# Engine's own keyword arguments (admission bounds, stream buffers, ...): not engine-config fields.
_ENGINE_OWN_OPTIONS = frozenset(name for name, p in _ENGINE_SIGNATURE.items() if p.kind is p.KEYWORD_ONLY)
_WATCHDOG_PERIOD = 0.25  # seconds between slow-consumer checks, as Engine's


class RayEngine:
    """The ``Engine`` interface over ``handle``, a ``DeploymentHandle`` to ``EngineReplica``s built
    with the same engine arguments (``model`` and ``engine_kwargs``, validated here as ``Engine``
    would). ``prefix_blocks``: leading KV blocks of a prompt that its route key covers."""

    def __init__(self, handle, model: Optional[str] = None, *, observers: Sequence[EngineObserver] = (),
                 prefix_blocks: int = 4, refresh_period: float = 1.0, **engine_kwargs: Any) -> None:
        from aioinfer.fetch import DEFAULT_MODEL

        self.config = EngineConfig.from_kwargs(
            model or DEFAULT_MODEL, **{k: v for k, v in engine_kwargs.items() if k not in _ENGINE_OWN_OPTIONS})
        stall_timeout = engine_kwargs.get("stall_timeout")
        self.stall_timeout = _ENGINE_SIGNATURE["stall_timeout"].default if stall_timeout is None else stall_timeout
        self.prefix_blocks = prefix_blocks
        self.refresh_period = refresh_period
        self.observers = list(observers)
        self.counters = {"aborted_slow_consumer": 0, "rejected_overloaded": 0, "finished": 0, "aborted": 0}
        self._handle = handle
        self._streaming = handle.options(stream=True)
        self._open: dict[str, RayStream] = {}
        self._info: dict = {}
        self._inputs: Optional[InputProcessor] = None
        self._accepting = False
        self._task_group: Optional[anyio.abc.TaskGroup] = None
        self.figures = ReplicaFigures(_directory_of(handle), self.observers)

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> "RayEngine":
        tokenizer = await anyio.to_thread.run_sync(_load_tokenizer, self.config)
        # The first replica's answer: it waits for one to be up (Ray queues the call meanwhile).
        self._info = info = await self._handle.info.remote()
        self._inputs = InputProcessor(tokenizer, info["vocab_size"], info["max_model_len"], (),
                                      seed=self.config.model.seed, max_logprobs=info["max_logprobs"])
        self._task_group = anyio.create_task_group()
        await self._task_group.__aenter__()
        self._task_group.start_soon(self._refresh, name="aioinfer-ray-figures")
        self._task_group.start_soon(self._watchdog, name="aioinfer-ray-slow-consumer-watchdog")
        self._accepting = True
        return self

    async def __aexit__(self, *exc_info) -> Optional[bool]:
        self._accepting = False
        for stream in list(self._open.values()):
            stream.abort("shutdown")  # their replicas abort them; the consumers get the final "abort" delta
        self._task_group.cancel_scope.cancel()
        return await self._task_group.__aexit__(*exc_info)

    async def _refresh(self) -> None:
        while True:
            try:
                await self.figures.refresh()
            except Exception:  # noqa: BLE001 - figures are information: the next round tries again
                logger.exception("reading the engine replicas' figures failed")
            await anyio.sleep(self.refresh_period)

    async def _watchdog(self) -> None:
        period = min(_WATCHDOG_PERIOD, self.stall_timeout / 2)
        while True:
            await anyio.sleep(period)
            now = time.monotonic()
            for stream in list(self._open.values()):
                probe = stream.stall_probe
                if probe is None:
                    continue
                try:
                    since = probe(now)
                except Exception:  # noqa: BLE001 - a failing probe gives no information (as Engine's)
                    logger.exception("request %s: the stall probe failed", stream.request_id)
                    stream.stall_probe = None
                    continue
                if since is not None and now - since > self.stall_timeout:
                    self.counters["aborted_slow_consumer"] += 1
                    stream.abort("slow_consumer", SlowConsumerError(
                        f"request {stream.request_id}: the consumer took nothing for {self.stall_timeout:g} s "
                        f"while output waited for it"))
                    on_stalled = getattr(probe, "on_stalled", None)
                    if on_stalled is not None:
                        call_observer(on_stalled)

    # ------------------------------------------------------------------ state

    @property
    def is_ready(self) -> bool:
        figures = self.figures
        return self._accepting and (figures.rounds == 0 or figures.alive > 0)

    @property
    def is_dead(self) -> bool:
        return False

    @property
    def tokenizer(self):
        return self._inputs.tokenizer if self._inputs is not None else None

    @property
    def max_model_len(self) -> int:
        return self._info["max_model_len"]

    @property
    def quantization(self) -> Optional[str]:
        return self._info.get("quantization")

    @property
    def vocab_size(self) -> int:
        return self._info["vocab_size"]

    @property
    def max_logprobs(self) -> int:
        return self._info["max_logprobs"]

    @property
    def generation_defaults(self) -> dict:
        return self._info.get("generation_defaults") or {}

    @property
    def block_size(self) -> int:
        return self._info.get("block_size") or self.config.cache.block_size

    # The served name, known before any replica answers (the metrics are labelled with it at start-up):
    # Engine's rule on the same config.
    model_name = Engine.model_name

    def stats(self) -> dict:
        """The alive replicas' figures summed, each replica's under ``replicas`` (by engine index), and
        this ingress's own counters and open streams."""
        total: dict[str, Any] = {"ready": self.is_ready, "dead": self.is_dead, **self.figures.totals(),
                                 "ingress_open_requests": len(self._open), "alive_replicas": self.figures.alive}
        total.update(self.counters)
        total["replicas"] = self.figures.per_replica()
        return total

    # ------------------------------------------------------------------ requests

    def tokenize(self, prompt: Prompt) -> list[int]:
        self._check_open()
        return self._inputs.tokenize(prompt)[1]

    async def prepare_structured_output(self, params, count: int = 1) -> None:
        """Nothing here: the replica that takes the request builds its matchers (in a worker thread)
        before it admits it, and a constraint that does not compile is its refusal (a 400)."""
        self._check_open()

    def generate(self, prompt: Prompt, sampling_params: Optional[SamplingParams] = None, *,
                 request_id: Optional[str] = None, priority: int = 0, deadline: Optional[float] = None,
                 cache_salt: Optional[str] = None, stream: bool = True, stall_probe=None) -> RayStream:
        """As ``Engine.generate``; raises at once what can be checked here (ValueError for bad input,
        EngineNotReady), and the replica's refusal from ``await stream.admitted()``."""
        self._check_open()
        params = sampling_params.clone() if sampling_params is not None else SamplingParams()
        if params.n != 1:
            raise ValueError("n must be 1 for Engine.generate; issue n calls (seed + i) for several samples")
        request_id = checked_request_id(request_id, self._open)
        _, prompt_ids = self._inputs.tokenize(prompt)
        cache_salt = prompt_salt(prompt, cache_salt)
        # The input processor's checks, as the engine makes them; the constraint is compiled (and
        # checked) by the replica, so that its matcher is not built twice.
        checked = params.clone()
        checked.structured_outputs = None
        self._inputs.make_request(request_id, prompt_ids, checked, priority=priority, cache_salt=cache_salt)
        route_key = prefix_route_key(prompt_ids, self.block_size, cache_salt, self.prefix_blocks)

        def start():
            return call_as_own_request(lambda: self._streaming.generate.remote(
                prompt_ids, params, request_id, priority=priority, cache_salt=cache_salt, stream=stream,
                route_key=route_key))

        ray_stream = RayStream(self, request_id, start, len(prompt_ids), deadline=deadline, stall_probe=stall_probe)
        self._open[request_id] = ray_stream
        return ray_stream

    async def abort(self, request_id: str, *, cause: str = "api") -> None:
        """Abort a request (unknown or ended ids are ignored); its consumer gets a final "abort" delta."""
        stream = self._open.get(request_id)
        if stream is not None:
            stream.abort(cause)

    # ------------------------------------------------------------------ RayStream's reports

    def _on_refused(self, exc: BaseException) -> None:
        if isinstance(exc, EngineOverloaded):
            self.counters["rejected_overloaded"] += 1
            reason = "overloaded"
        elif isinstance(exc, AdmissionLimitExceeded):
            reason = "invalid"
        else:
            return
        for observer in self.observers:
            call_observer(observer.on_rejected, reason)

    def _forget(self, stream: RayStream) -> None:
        if self._open.get(stream.request_id) is stream:
            del self._open[stream.request_id]

    def _on_end(self, stream: RayStream, status: str, stats: RequestStats) -> None:
        self._forget(stream)
        self.counters["finished" if status == "finished" else "aborted"] += 1
        stats = dataclasses.replace(stats, engine_index=self.figures.index_of(stream.replica_id))
        for observer in self.observers:
            call_observer(observer.on_request_done, stats)

    def _check_open(self) -> None:
        if not self._accepting:
            raise EngineNotReady("the engine is not running (not started yet, or shutting down)")


def call_as_own_request(call):
    """``call()`` (a handle call) under a Ray Serve request identity of its own.

    Inside an HTTP request, Ray Serve gives every handle call the request's ``internal_request_id``,
    and its request router keeps pending calls in a dict by that id: two calls of one HTTP request
    routed at the same time (the choices of ``n`` > 1, several prompts) take one entry, and one of
    them is never sent, so the request hangs. So each call runs in a copy of the context whose Serve
    request context has a fresh internal id (its ``request_id``, which the logs show, is kept).
    Should Ray's context variable move, the call runs in an empty context: a fresh id too."""
    import contextvars
    import uuid

    try:
        from ray.serve import context as serve_context

        variable = serve_context._serve_request_context
        current = variable.get()
    except (ImportError, AttributeError):
        return contextvars.Context().run(call)

    def with_own_id():
        if current is not None:
            variable.set(dataclasses.replace(current, _internal_request_id=uuid.uuid4().hex))
        return call()

    return contextvars.copy_context().run(with_own_id)


def _load_tokenizer(config: EngineConfig):
    """The model's tokenizer, found as the engine's loader finds it (a GGUF's from its metadata), without
    its weights."""
    from aioinfer.executor.model_setup import local_model_name
    from aioinfer.models.loader import open_model_source
    from aioinfer.text.tokenizer import load_tokenizer

    return load_tokenizer(open_model_source(local_model_name(config.model.model)), config.model.tokenizer)


def _directory_of(handle) -> Optional[ReplicaDirectory]:
    deployment = getattr(handle, "deployment_name", None)
    if not deployment:
        return None
    return ReplicaDirectory(getattr(handle, "app_name", "") or "", deployment)

