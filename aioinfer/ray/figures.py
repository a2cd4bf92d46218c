"""The engine replicas' figures as the ingress keeps them: for ``stats()`` (``/metrics``' gauges) and
for the metrics observers, which count tokens and cache hits from each replica's steps.

A replica's steps happen in its own process, where the ingress's observers cannot see them, and
sending a record per step to the ingress would cost a message per step. So each replica keeps
running totals of its steps' counts (replica.py ``ReplicaRecords``), the ingress reads them about
once a second (directory.py) and hands the observers one ``StepStats`` per replica holding what
the totals grew by since the last read (with ``num_batched_requests`` 0: a step's histograms,
its duration and batch size, are the replica's to keep). The counters (vLLM's
``prompt_tokens_total``, ``generation_tokens_total``, prefix-cache queries and hits,
preemptions, speculative tokens) thus match the single server's, a second late at most.

Engine indexes (the ``engine`` label of the series): each replica gets the next index the first
time it is seen, and keeps it while it lives; a replica that Ray replaced is a new one with a new
index, and the gone one's gauges read 0. Totals of replicas already running when the ingress
starts count from that first read (their earlier work is not this ingress's to count again).
"""

from __future__ import annotations

import logging
from typing import Any, Optional, Sequence

import anyio

from aioinfer.async_engine.stats import StepStats, call_observer
from aioinfer.ray.directory import ReplicaDirectory
from aioinfer.ray.replica import STEP_TOTALS

logger = logging.getLogger(__name__)

_GAUGES = ("open_requests", "waiting_admission", "waiting_admission_tokens", "num_running", "num_waiting")


class ReplicaFigures:
    def __init__(self, directory: Optional[ReplicaDirectory], observers: Sequence[Any]) -> None:
        self.directory = directory  # None: no per-replica figures (no Serve context to find them in)
        self.observers = observers
        self.index: dict[str, int] = {}  # replica id -> engine index, in order of first sight
        self.latest: dict[str, dict] = {}  # replica id -> its last figures (alive replicas only)
        self.rounds = 0  # reads that reached Ray's actor list
        self._totals: dict[str, dict[str, int]] = {}  # replica id -> step totals at the last read
        self._spec: dict[str, list[int]] = {}
        self._warned = False

    def index_of(self, replica_id: Optional[str]) -> int:
        if replica_id is None:
            return 0
        index = self.index.get(replica_id)
        if index is None:
            index = self.index[replica_id] = len(self.index)
        return index

    @property
    def alive(self) -> int:
        return len(self.latest)

    async def refresh(self) -> None:
        """Read every replica's figures once; the observers hear of the steps since the last read."""
        if self.directory is None:
            return
        try:
            actors = await anyio.to_thread.run_sync(self.directory.actors)
        except Exception:  # noqa: BLE001 - Ray's control store unreachable for now: keep the last figures
            if not self._warned:
                logger.warning("cannot list the engine replicas (the figures in /metrics stay as they were)",
                               exc_info=True)
                self._warned = True
            return
        answers = await self.directory.routing_stats(actors)
        first_read = self.rounds == 0
        for replica_id, figures in sorted(answers.items(), key=lambda item: self.index_of(item[0])):
            self._observe_steps(replica_id, figures, baseline=first_read)
        self.latest = answers
        self.rounds += 1

    def _observe_steps(self, replica_id: str, figures: dict, baseline: bool) -> None:
        totals = figures.get("step_totals") or {}
        spec = list(figures.get("spec_accepted_per_position") or ())
        before = self._totals.get(replica_id)
        spec_before = self._spec.get(replica_id, [])
        self._totals[replica_id], self._spec[replica_id] = dict(totals), spec
        if before is None and baseline:
            return
        before = before or {}
        grown = {name: totals.get(name, 0) - before.get(name, 0) for name in STEP_TOTALS}
        spec_grown = tuple(count - (spec_before[i] if i < len(spec_before) else 0) for i, count in enumerate(spec))
        if not any(grown.values()) and not any(spec_grown):
            return
        stats = StepStats(num_running=figures.get("num_running", 0), num_waiting=figures.get("num_waiting", 0),
                          kv_usage=figures.get("kv_usage", 0.0), num_batched_requests=0, num_scheduled_tokens=0,
                          num_generation_tokens=grown["num_generation_tokens"], num_preempted=grown["num_preempted"],
                          step_time=0.0, engine_index=self.index_of(replica_id),
                          num_prefix_cache_queries=grown["num_prefix_cache_queries"],
                          num_prefix_cache_hits=grown["num_prefix_cache_hits"],
                          num_prefilled_prompt_tokens=grown["num_prefilled_prompt_tokens"],
                          num_spec_drafts=grown["num_spec_drafts"],
                          num_spec_draft_tokens=grown["num_spec_draft_tokens"],
                          num_spec_accepted_tokens=grown["num_spec_accepted_tokens"],
                          spec_accepted_per_position=spec_grown)
        for observer in self.observers:
            call_observer(observer.on_step, stats)

    def per_replica(self) -> list[dict]:
        """One dict per engine index (a gone replica's: zeros), as ``stats()["replicas"]``."""
        by_index = {index: replica_id for replica_id, index in self.index.items()}
        rows = []
        for index in range(len(self.index)):
            replica_id = by_index[index]
            figures = self.latest.get(replica_id)
            if figures is None:
                rows.append({"replica_id": replica_id, "alive": False, "kv_usage": 0.0, **dict.fromkeys(_GAUGES, 0)})
            else:
                rows.append({"replica_id": replica_id, "alive": True, "kv_usage": figures.get("kv_usage", 0.0),
                             **{key: figures.get(key, 0) for key in _GAUGES},
                             **({"cache_config": figures["cache_config"]} if figures.get("cache_config") else {})})
        return rows

    def totals(self) -> dict[str, Any]:
        """The alive replicas' gauges summed (``kv_usage``: their mean, the pools being alike)."""
        alive = list(self.latest.values())
        total: dict[str, Any] = {key: sum(f.get(key, 0) for f in alive) for key in _GAUGES}
        total["kv_usage"] = sum(f.get("kv_usage", 0.0) for f in alive) / len(alive) if alive else 0.0
        return total
