"""Data parallelism in one process: N whole-model replicas behind the ``Engine`` interface.

``async with DataParallelEngine(model, data_parallel_size=2) as engine`` runs replica ``i`` as an
ordinary ``Engine`` with its own GPU thread on its own device (``placement``); ``generate``
sends each request to the replica the ``Router`` picks (least outstanding work, prefix affinity)
and returns that replica's stream, wrapped only to count the request's progress as load.

Lifecycle: one owner task per replica enters and leaves it (anyio wants a task group left by the
task that entered it). Replicas start one after another: a replica captures CUDA graphs while it
starts, and under CUDA's default (global) capture mode another thread's allocation or copy would
break that capture. Ready when every replica is ready.

Health: the engine counts as dead once any replica died. A dead replica means a broken device or a
bug; serving on at 1/N capacity while reporting healthy would hide it, so ``/health`` turns 503 and
the supervisor restarts the process. New requests are refused from then on; requests already on
the other replicas run to their end.
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass
from typing import Any, AsyncIterator, Optional, Sequence

import anyio

from aioinfer.async_engine.admission import RETRY_AFTER_UNKNOWN, fits_across, replicas_limit_error
from aioinfer.async_engine.engine import Engine, Prompt, checked_request_id
from aioinfer.async_engine.stats import EngineObserver
from aioinfer.config import EngineConfig
from aioinfer.data_parallel.placement import replica_devices
from aioinfer.data_parallel.replica import IndexedObserver, ReplicaEngine, RequestEndTracker, SharedTokenizer
from aioinfer.data_parallel.router import Router
from aioinfer.engine.delta import GenerationDelta
from aioinfer.engine.input_processor import prompt_salt
from aioinfer.errors import EngineDeadError, EngineNotReady, EngineOverloaded
from aioinfer.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class _OpenRequest:
    replica: int
    max_tokens: int  # output tokens it may still produce at most, counted from admission
    load: int  # outstanding tokens it adds to its replica's load now


class DataParallelEngine:
    """``Engine``'s async interface over ``data_parallel_size`` replicas (keyword arguments as ``Engine``'s;
    ``router_options`` go to ``Router``: affinity margins, prefix map size, output estimate)."""

    def __init__(self, model: Optional[str] = None, *, observers: Sequence[EngineObserver] = (),
                 router_options: Optional[dict[str, Any]] = None, **kwargs: Any) -> None:
        import torch

        from aioinfer.fetch import DEFAULT_MODEL

        engine_kwargs = {k: v for k, v in kwargs.items() if k not in _ENGINE_OWN_OPTIONS}
        self.config = EngineConfig.from_kwargs(model or DEFAULT_MODEL, **engine_kwargs)  # validates once
        size = self.config.parallel.data_parallel_size
        if size > 1 and self.config.parallel.tensor_parallel_size > 1:
            # Fail before replica 0 loads, not when replica 1 starts: a tensor-parallel engine takes the
            # process's one default torch.distributed group, so two cannot live in one process.
            raise ValueError("data_parallel_size > 1 with tensor_parallel_size > 1 is not supported in one "
                             "process: each tensor-parallel replica needs a process of its own")
        devices = replica_devices(self.config.device, size, self.config.parallel.tensor_parallel_size,
                                  torch.cuda.device_count() if self.config.device != "cpu" else 0)
        self.observers = list(observers)
        tokenizer = SharedTokenizer()
        self._replicas = [
            ReplicaEngine(i, tokenizer, model=model, **{**kwargs, "data_parallel_size": 1, "device": device},
                          observers=[RequestEndTracker(i, self._on_request_end),
                                     *(IndexedObserver(i, o) for o in self.observers)])
            for i, device in enumerate(devices)]
        self.router = Router(size, self.config.cache.block_size, **(router_options or {}))
        self._open: dict[str, _OpenRequest] = {}
        self._routed = [[0, 0] for _ in devices]  # per replica: [requests routed, of them by prefix affinity]
        self._rejected = 0
        self._accepting = False
        self._stop: Optional[anyio.Event] = None  # made in __aenter__: an Event needs the running event loop
        self._task_group: Optional[anyio.abc.TaskGroup] = None

    @property
    def replicas(self) -> list[ReplicaEngine]:
        return list(self._replicas)

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> "DataParallelEngine":
        self._stop = anyio.Event()
        self._task_group = anyio.create_task_group()
        await self._task_group.__aenter__()
        try:
            for replica in self._replicas:
                started = anyio.Event()
                failure: list[BaseException] = []
                self._task_group.start_soon(self._own_replica, replica, started, failure,
                                            name=f"aioinfer-replica-{replica.index}-owner")
                await started.wait()
                if failure:
                    raise failure[0]
            self._accepting = True
        except BaseException:
            self._stop.set()
            self._task_group.cancel_scope.cancel()  # a replica still loading stops at its next checkpoint
            await self._task_group.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(self, *exc_info) -> Optional[bool]:
        self._accepting = False
        self._stop.set()  # every owner leaves its replica: open requests are aborted, threads joined
        return await self._task_group.__aexit__(*exc_info)

    async def _own_replica(self, replica: ReplicaEngine, started: anyio.Event, failure: list) -> None:
        try:
            async with replica:
                started.set()
                await self._stop.wait()
        except Exception as exc:  # noqa: BLE001 - a load failure is raised by __aenter__
            if started.is_set():
                logger.exception("replica %d stopped with an error", replica.index)
            failure.append(exc)
        finally:
            started.set()

    # ------------------------------------------------------------------ state

    @property
    def is_ready(self) -> bool:
        return self._accepting and all(r.is_ready for r in self._replicas)

    @property
    def is_dead(self) -> bool:
        return any(r.is_dead for r in self._replicas)

    @property
    def tokenizer(self):
        return self._replicas[0].tokenizer

    @property
    def max_model_len(self) -> int:
        return self._replicas[0].max_model_len

    @property
    def quantization(self) -> Optional[str]:
        return self._replicas[0].quantization

    @property
    def vocab_size(self) -> int:
        return self._replicas[0].vocab_size

    @property
    def max_logprobs(self) -> int:
        return self._replicas[0].max_logprobs

    @property
    def generation_defaults(self) -> dict:
        return self._replicas[0].generation_defaults

    @property
    def model_name(self) -> str:
        return self._replicas[0].model_name

    @property
    def counters(self) -> dict[str, int]:
        total = {key: sum(r.counters[key] for r in self._replicas) for key in self._replicas[0].counters}
        total["rejected_overloaded"] += self._rejected
        return total

    def stats(self) -> dict:
        """Sums over the replicas (``kv_usage``: their mean, the pools being alike), and each
        replica's own figures, with its router load, under ``replicas``."""
        per = []
        for replica, load, (routed, affine) in zip(self._replicas, self.router.loads, self._routed):
            per.append({**replica.stats(), "load_tokens": load.tokens, "routed": routed, "routed_by_affinity": affine,
                        "device": replica.config.device})
        total: dict[str, Any] = {"ready": self.is_ready, "dead": self.is_dead}
        for key in ("open_requests", "waiting_admission", "waiting_admission_tokens", "num_running", "num_waiting"):
            total[key] = sum(s[key] for s in per)
        total["kv_usage"] = sum(s["kv_usage"] for s in per) / len(per)
        total.update(self.counters)
        total["replicas"] = per
        return total

    # ------------------------------------------------------------------ requests

    def tokenize(self, prompt: Prompt) -> list[int]:
        self._check_open()
        return self._replicas[0].tokenize(prompt)

    async def prepare_structured_output(self, params, count: int = 1) -> None:
        """``Engine.prepare_structured_output`` on every replica (each keeps its own grammar cache; the
        replicas that do not get the requests keep their matchers for later ones, a bounded number)."""
        for replica in self._replicas:
            await replica.prepare_structured_output(params, count)

    def generate(self, prompt: Prompt, sampling_params: Optional[SamplingParams] = None, *,
                 request_id: Optional[str] = None, priority: int = 0,
                 deadline: Optional[float] = None, cache_salt: Optional[str] = None,
                 stream: bool = True, stall_probe=None) -> AsyncIterator[GenerationDelta]:
        """As ``Engine.generate`` (``stream=False``: one merged final delta); the request runs on one
        replica from start to end."""
        self._check_open()
        request_id = checked_request_id(request_id, self._open)
        prompt_ids = self._replicas[0].tokenize(prompt)  # once, here: the router hashes the ids
        cache_salt = prompt_salt(prompt, cache_salt)  # a prompt dict's own salt
        self.check_admission((len(prompt_ids),))  # never admissible: 400; all replicas full: 429
        hashes = self.router.block_hashes(prompt_ids, cache_salt)
        route = self.router.choose(hashes, [r.is_ready and r.has_room(len(prompt_ids)) for r in self._replicas])
        if route is None:
            self._refuse(min((r.admission.retry_after(1, len(prompt_ids)) for r in self._replicas if r.is_ready),
                             default=RETRY_AFTER_UNKNOWN))
        replica = self._replicas[route.replica]
        deltas = replica.generate(prompt_ids, sampling_params, request_id=request_id, priority=priority,
                                  deadline=deadline, cache_salt=cache_salt, stream=stream,
                                  stall_probe=stall_probe)  # raises on bad input first
        max_tokens = replica.max_model_len - len(prompt_ids)
        if sampling_params is not None and sampling_params.max_tokens is not None:
            max_tokens = sampling_params.max_tokens
        load = self.router.outstanding_tokens(len(prompt_ids), max_tokens)
        self._open[request_id] = _OpenRequest(route.replica, max_tokens, load)
        self.router.add(route.replica, load)
        self.router.record(hashes, route.replica)
        self._routed[route.replica][0] += 1
        self._routed[route.replica][1] += route.by_affinity
        for observer in self.observers:
            on_routed = getattr(observer, "on_routed", None)
            if on_routed is not None:
                _safe(on_routed, route.replica, route.by_affinity)
        return self._follow(request_id, deltas)

    def check_admission(self, prompt_lengths: Sequence[int]) -> None:
        """As ``Engine.check_admission``, over the replicas: the requests must fit their queues together
        (placed longest first; the router then places each one where it has room, so a fan-out that
        passed is admitted whole except in a race the router's affinity cannot see)."""
        self._check_open()
        queues = [r.admission for r in self._replicas]
        if not fits_across(prompt_lengths, [(q.max_requests, q.max_prompt_tokens) for q in queues]):
            for observer in self.observers:
                _safe(observer.on_rejected, "invalid")
            raise replicas_limit_error(prompt_lengths, queues)
        ready = [r.admission for r in self._replicas if r.is_ready]
        if not fits_across(prompt_lengths, [q.room for q in ready]):
            count, total = len(prompt_lengths), sum(prompt_lengths)
            self._refuse(min((q.retry_after(count, total) for q in ready), default=RETRY_AFTER_UNKNOWN))

    async def abort(self, request_id: str, *, cause: str = "api") -> None:
        """Abort a request on whichever replica runs it (unknown or ended ids are ignored)."""
        request = self._open.get(request_id)
        if request is not None:
            await self._replicas[request.replica].abort(request_id, cause=cause)

    async def _follow(self, request_id: str, stream: AsyncIterator[GenerationDelta]) -> AsyncIterator[GenerationDelta]:
        # The replica's stream does the work (cancellation, deadlines, errors); this only tracks load.
        # Per token on the shared event loop: while the output still left exceeds the router's
        # estimate the load does not change, and such deltas cost no router call.
        open_requests, router = self._open, self.router
        try:
            async for delta in stream:
                request = open_requests.get(request_id)
                if request is not None:  # the first delta comes after the prompt was computed
                    load = router.outstanding_tokens(0, request.max_tokens - delta.num_output_tokens)
                    if load != request.load:
                        router.adjust(request.replica, load - request.load)
                        request.load = load
                yield delta
        finally:
            await stream.aclose()  # leaving early aborts it now, not when the stream is collected

    def _on_request_end(self, replica: int, request_id: str) -> None:
        request = self._open.get(request_id)
        if request is not None and request.replica == replica:
            del self._open[request_id]
            self.router.remove(replica, request.load)

    def _check_open(self) -> None:
        dead = next((r for r in self._replicas if r.is_dead), None)
        if dead is not None:
            raise EngineDeadError(f"replica {dead.index} of the data-parallel engine is dead")
        if not self._accepting:
            raise EngineNotReady("the engine is not running (not started yet, or shutting down)")

    def _refuse(self, retry_after: float) -> None:
        self._rejected += 1
        for observer in self.observers:
            _safe(observer.on_rejected, "overloaded")
        raise EngineOverloaded(f"all {len(self._replicas)} replicas are at capacity; retry later",
                               retry_after=retry_after)


def create_engine(model: Optional[str] = None, **kwargs: Any):
    """An ``Engine``, or a ``DataParallelEngine`` when ``data_parallel_size`` > 1 (the server's factory)."""
    if kwargs.get("data_parallel_size", 1) > 1:
        return DataParallelEngine(model, **kwargs)
    return Engine(model, **kwargs)


# Engine's own keyword arguments (admission bounds, stream buffers, ...): every other one is an
# engine-config field, validated once here by EngineConfig.from_kwargs.
_ENGINE_OWN_OPTIONS = frozenset(
    name for name, p in inspect.signature(Engine.__init__).parameters.items() if p.kind is p.KEYWORD_ONLY)


def _safe(method, *args) -> None:
    try:
        method(*args)
    except Exception:  # noqa: BLE001 - observers must never break serving
        logger.exception("engine observer %r failed", method)
