"""One engine replica of a Ray Serve deployment: an ordinary ``Engine`` in its own Ray actor process.

``EngineReplica`` is a plain class; ``aioinfer.entrypoints.ray_app`` wraps it with
``serve.deployment(...)`` and its options (replicas, GPUs, the request router), so nothing here is
decided at import. Ray Serve builds it with ``async __init__`` on the replica's user-code event
loop and calls every method on that loop, so the engine's consumer side lives where it was entered.

Lifecycle: one owner task enters ``async with Engine(...)`` and, on shutdown, leaves it (anyio
wants a task group left by the task that entered it, as ``ServerState._own_engine`` does). The
constructor returns once the engine has warmed up, so Ray counts the replica as running only when
it can serve. On a graceful stop Ray Serve first lets open requests drain
(``graceful_shutdown_timeout_s``), then calls ``__del__`` and awaits what it returns: the owner's
exit (open requests aborted, the GPU thread joined). ``check_health``, which Ray calls every few
seconds, raises once the engine is dead, so the controller replaces the replica.

Streams (``generate``): the first item says whether the engine admitted the request, so that the
ingress can answer a refused request with the same 400 / 429 as a single server before it sends
anything (wire.py has the messages); then one item per wake-up of the engine's consumer. The
engine's consumer already takes every delta buffered for it as one merged delta
(``request_channel.iterate_deltas``), so each item carries all the output the replica had when it
was sent. (The ingress cannot merge further: Ray's stream offers no non-blocking look at items
already received, so it takes them one by one.) When the caller cancels the stream (the HTTP
client went away), Ray raises ``CancelledError`` inside ``generate``; leaving it closes the engine's
iterator, which aborts the request and frees its KV blocks at the next step.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import uuid
from typing import Any, Optional

from aioinfer.async_engine.engine import Engine
from aioinfer.async_engine.stats import RequestStats, StepStats
from aioinfer.config import KVEventsConfig
from aioinfer.engine.kv_events_publisher import offset_endpoint
from aioinfer.ray.wire import ADMITTED, FINAL, error_message
from aioinfer.sampling_params import SamplingParams
from aioinfer.server_config import configure_server_logging

logger = logging.getLogger(__name__)

# StepStats' counts that the ingress turns into its Prometheus counters (summed per replica here).
STEP_TOTALS = ("num_generation_tokens", "num_prefilled_prompt_tokens", "num_preempted", "num_prefix_cache_queries",
               "num_prefix_cache_hits", "num_spec_drafts", "num_spec_draft_tokens", "num_spec_accepted_tokens")


class ReplicaRecords:
    """The replica engine's observer: running totals of its steps' counts, and the record of each
    request a stream still follows, kept from the request's end until its stream sends it."""

    def __init__(self) -> None:
        self.totals = dict.fromkeys(STEP_TOTALS, 0)
        self.spec_accepted_per_position: list[int] = []
        self._followed: set[str] = set()
        self._ended: dict[str, RequestStats] = {}

    def follow(self, request_id: str) -> None:
        self._followed.add(request_id)

    def take(self, request_id: str) -> Optional[RequestStats]:
        return self._ended.pop(request_id, None)

    def forget(self, request_id: str) -> None:
        self._followed.discard(request_id)
        self._ended.pop(request_id, None)

    def on_step(self, stats: StepStats) -> None:
        totals = self.totals
        for name in STEP_TOTALS:
            totals[name] += getattr(stats, name)
        for position, count in enumerate(stats.spec_accepted_per_position):
            if position == len(self.spec_accepted_per_position):
                self.spec_accepted_per_position.append(0)
            self.spec_accepted_per_position[position] += count

    def on_request_done(self, stats: RequestStats) -> None:
        if stats.request_id in self._followed:
            self._ended[stats.request_id] = stats

    def on_rejected(self, reason: str) -> None:  # the ingress counts refusals as it hears of them
        pass


class EngineReplica:
    """Ray Serve deployment class: one ``Engine(**engine_kwargs)`` (the server's engine arguments,
    model included). Wrap with ``serve.deployment``; every public method is a handle method."""

    async def __init__(self, engine_kwargs: dict) -> None:
        configure_server_logging()  # the start-up phases and errors reach the replica's log, as a server's
        self.replica_id = _replica_id()
        self.gpu_ids = _gpu_ids()  # the GPUs Ray gave this replica (its CUDA_VISIBLE_DEVICES), for the figures
        self._records = ReplicaRecords()
        engine_kwargs = with_replica_event_endpoints(engine_kwargs, _local_rank())
        self._engine = Engine(observers=[self._records], **engine_kwargs)
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._stopping = False
        self._failure: Optional[BaseException] = None
        started = asyncio.Event()
        self._owner = asyncio.create_task(self._own_engine(started), name="aioinfer-replica-engine-owner")
        await started.wait()
        if self._failure is not None:
            await asyncio.gather(self._owner, return_exceptions=True)
            raise self._failure

    async def _own_engine(self, started: asyncio.Event) -> None:
        try:
            async with self._engine:
                started.set()
                logger.info("engine replica %s ready: model %s", self.replica_id, self._engine.model_name)
                await self._stop.wait()
            logger.info("engine replica %s stopped", self.replica_id)
        except BaseException as exc:  # noqa: BLE001 - a start failure is raised by __init__
            self._failure = exc
            if started.is_set():
                logger.exception("engine replica %s stopped with an error", self.replica_id)
        finally:
            started.set()

    def __del__(self):
        """Ray Serve's graceful stop calls this and awaits the coroutine it returns (the engine's exit).
        Called again by the garbage collector, or off the replica's loop, it does nothing."""
        if getattr(self, "_owner", None) is None or self._stopping:
            return None
        try:
            on_loop = asyncio.get_running_loop() is self._loop
        except RuntimeError:
            on_loop = False
        if not on_loop:
            return None
        self._stopping = True
        self._stop.set()
        return self._wait_for_owner()

    async def _wait_for_owner(self) -> None:
        await asyncio.gather(self._owner, return_exceptions=True)

    # ------------------------------------------------------------------ handle methods

    async def info(self) -> dict:
        """What the ingress needs to know of the model (the same on every replica)."""
        engine = self._engine
        return {"model_name": engine.model_name, "max_model_len": engine.max_model_len,
                "vocab_size": engine.vocab_size, "max_logprobs": engine.max_logprobs,
                "generation_defaults": engine.generation_defaults, "quantization": engine.quantization,
                "kv_cache_dtype": engine.config.cache.kv_cache_dtype, "block_size": engine.config.cache.block_size,
                "replica_id": self.replica_id}

    async def generate(self, prompt_ids: list[int], params: Optional[SamplingParams] = None,
                       request_id: Optional[str] = None, priority: int = 0, cache_salt: Optional[str] = None,
                       stream: bool = True, route_key: Optional[int] = None):
        """Stream one request (call with ``handle.options(stream=True)``): first ``(ADMITTED,
        replica_id)`` or ``(ERROR, ...)``, then ``GenerationDelta``s, the last one inside
        ``(FINAL, delta, stats)``, or an ``(ERROR, ...)`` if the request failed (wire.py).
        ``route_key``: the request router's (routing.py); the replica does not use it."""
        engine = self._engine
        request_id = request_id or f"req-{uuid.uuid4().hex}"
        try:
            constraint = params.structured_outputs if params is not None else None
            if constraint is not None:  # the matcher is built in a worker thread, not on this loop
                await engine.prepare_structured_output(constraint)
            deltas = engine.generate(prompt_ids, params, request_id=request_id, priority=priority,
                                     cache_salt=cache_salt, stream=stream)
        except Exception as exc:  # noqa: BLE001 - a refusal is the stream's answer, not a Ray error
            yield error_message(exc)
            return
        records = self._records
        records.follow(request_id)
        try:
            yield (ADMITTED, self.replica_id)
            async for delta in deltas:
                if delta.finish_reason is None:
                    yield delta
                else:  # the engine recorded the request before its consumer woke: its record is here
                    yield (FINAL, delta, records.take(request_id))
        except Exception as exc:  # noqa: BLE001 - the engine died, ...: told to the ingress as data
            yield error_message(exc)
        finally:
            await deltas.aclose()  # a cancelled stream (client gone) aborts the request here
            records.forget(request_id)

    async def abort(self, request_id: str) -> None:
        """Abort a request this replica runs (unknown or ended ids are ignored)."""
        await self._engine.abort(request_id)

    async def stats(self) -> dict:
        return {**self._engine.stats(), "replica_id": self.replica_id}

    async def check_health(self) -> None:
        """Ray Serve's health check: raising makes the controller replace this replica."""
        if self._engine.is_dead:
            raise RuntimeError(f"engine replica {self.replica_id}: the engine is dead (its step loop failed)")
        if self._owner.done():
            raise RuntimeError(f"engine replica {self.replica_id}: the engine stopped")

    async def record_routing_stats(self) -> dict[str, Any]:
        """Ray Serve polls this for its request router; the ingress reads it for /metrics (directory.py).
        A few numbers: queue and KV figures, the engine's counters, and the running step totals."""
        stats = self._engine.stats()
        return {"replica_id": self.replica_id, "gpu_ids": self.gpu_ids, "ready": stats["ready"], "dead": stats["dead"],
                "num_waiting": stats["num_waiting"], "num_running": stats["num_running"],
                "kv_usage": stats["kv_usage"], "open_requests": stats["open_requests"],
                "waiting_admission": stats["waiting_admission"],
                "waiting_admission_tokens": stats["waiting_admission_tokens"],
                "cache_config": stats.get("cache_config"), "counters": dict(self._engine.counters),
                "step_totals": dict(self._records.totals),
                "spec_accepted_per_position": list(self._records.spec_accepted_per_position)}


def with_replica_event_endpoints(engine_kwargs: dict, local_rank: int) -> dict:
    """The engine arguments of the replica of rank ``local_rank`` on its node: with KV-cache events
    on, its PUB (and replay) socket at the configured port plus the rank, as data-parallel
    replicas do (vLLM's convention), so that the replicas of one machine do not contend for one port."""
    events = KVEventsConfig.from_value(engine_kwargs.get("kv_events_config"))
    if events is None or not events.publishes or local_rank == 0:
        return engine_kwargs
    moved = dataclasses.replace(events, endpoint=offset_endpoint(events.endpoint, local_rank),
                                replay_endpoint=offset_endpoint(events.replay_endpoint, local_rank))
    return {**engine_kwargs, "kv_events_config": moved}


def _local_rank() -> int:
    """This replica's rank among its deployment's replicas on its node (0 outside a Serve replica)."""
    try:
        from ray import serve

        return int(serve.get_replica_context().rank.local_rank)
    except Exception:  # noqa: BLE001 - not a Serve replica, or a Ray without ranks
        return 0


def _gpu_ids() -> list:
    try:
        import ray

        return list(ray.get_gpu_ids()) if ray.is_initialized() else []  # never start a Ray here
    except Exception:  # noqa: BLE001 - outside a Ray worker (tests build the class directly)
        return []


def _replica_id() -> Optional[str]:
    """This replica's id in Ray Serve (None outside a Serve replica)."""
    try:
        from ray import serve

        return serve.get_replica_context().replica_id.unique_id
    except Exception:  # noqa: BLE001 - not running as a Serve replica (tests build the class directly)
        return None
