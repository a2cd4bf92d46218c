"""The engine replicas of a deployment, found and asked for their figures one by one.

A ``DeploymentHandle`` sends each call to a replica of the router's choosing; Ray Serve has no
public call that reaches every replica, which ``/metrics`` (each replica's queue and KV gauges)
and the tests (each replica's open requests; the actor to kill) need. Two stable facts of Ray
Serve serve instead: each replica is a named actor in the ``serve`` namespace, named
``SERVE_REPLICA::<app>#<deployment>#<replica id>`` (``ReplicaID.to_full_id_str``), listed by
the public ``ray.util.list_named_actors``; and the replica actor has a ``record_routing_stats``
method, which is how Ray's controller polls the deployment's ``record_routing_stats`` for the
request routers (EngineReplica's returns its queue, KV and counter figures).

Listing and looking up actors are blocking calls to Ray's control store: run them off the event
loop (``anyio.to_thread``). A replica that does not answer within the timeout (starting, dying,
dead) is left out of that round.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Optional

logger = logging.getLogger(__name__)

SERVE_NAMESPACE = "serve"  # ray.serve._private.constants.SERVE_NAMESPACE
REPLICA_PREFIX = "SERVE_REPLICA::"  # ray.serve._private.common.REPLICA_ID_FULL_ID_STR_PREFIX


class ReplicaDirectory:
    """The live replica actors of deployment ``deployment`` of application ``app``."""

    def __init__(self, app: str, deployment: str) -> None:
        self.app = app
        self.deployment = deployment
        self._prefix = f"{REPLICA_PREFIX}{app}#{deployment}#" if app else f"{REPLICA_PREFIX}{deployment}#"
        self._actors: dict[str, Any] = {}  # replica id -> actor handle, kept while the name is listed

    def actors(self) -> dict[str, Any]:
        """Replica id -> actor handle, for every replica actor now registered (blocking)."""
        import ray

        names = {entry["name"] for entry in ray.util.list_named_actors(all_namespaces=True)
                 if entry["namespace"] == SERVE_NAMESPACE and entry["name"].startswith(self._prefix)}
        found = {}
        for name in names:
            replica_id = name[len(self._prefix):]
            actor = self._actors.get(replica_id)
            if actor is None:
                try:
                    actor = ray.get_actor(name, namespace=SERVE_NAMESPACE)
                except ValueError:  # gone since it was listed
                    continue
            found[replica_id] = actor
        self._actors = found
        return dict(found)

    async def routing_stats(self, actors: dict[str, Any], timeout: float = 2.0) -> dict[str, dict]:
        """Each replica's ``record_routing_stats()``, asked of all at once; the ones that answer."""
        async def ask(replica_id: str, actor) -> tuple[str, Optional[dict]]:
            try:
                return replica_id, await asyncio.wait_for(_awaitable(actor.record_routing_stats.remote()), timeout)
            except Exception as exc:  # noqa: BLE001 - starting, dying or dead: left out of this round
                logger.debug("replica %s gave no figures: %r", replica_id, exc)
                return replica_id, None

        answers = await asyncio.gather(*(ask(rid, actor) for rid, actor in actors.items()))
        return {rid: stats for rid, stats in answers if isinstance(stats, dict)}


async def _awaitable(ref):
    return await ref
