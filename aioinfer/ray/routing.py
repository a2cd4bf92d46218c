"""Which engine replica of a Ray Serve deployment takes a request: the one that most likely holds
the prompt's leading KV blocks in its prefix cache, unless it is much busier than the others.

The in-process router (``aioinfer.data_parallel.router``) remembers which replica served each
prefix. Here that memory cannot be shared: every ingress replica (and every process holding a
``DeploymentHandle``) routes on its own. So the memory is replaced by a function all of them
compute alike: the ingress, which has already tokenized the prompt, derives a *route key* from
the prompt's first ``prefix_blocks`` full KV blocks (chained, as the prefix cache chains block
hashes, and salted by ``cache_salt``), passes it as the ``route_key`` keyword of the handle call,
and the router sends equal keys to the same replica by rendezvous (highest-random-weight)
hashing over the live replica ids. Rendezvous needs no shared state, and when a replica joins or
leaves only the keys it wins (or won) move; every other prefix stays where its cache is warm.

Every hash here is process-independent (``hashlib``; never ``hash()`` of a ``str``, which
Python salts per process), so two ingress processes agree on every key and every order.

Load guard: Ray's queue-length cache (on by default for handles) says how many requests each
replica has open. When the preferred replica's count exceeds the least among the candidates by
more than ``imbalance_threshold``, or the replica is at its ``max_ongoing_requests``, queueing
behind it costs more than recomputing the prefix elsewhere: the request falls back to the
power-of-two-choices procedure of Ray's default router. Requests without a key (a prompt shorter
than one block) use power of two choices too.

Base class: plain ``RequestRouter``, deliberately without ``FIFOMixin``. FIFOMixin hands the
replica a routing task found to whichever request heads the queue, so under concurrent routing a
replica chosen for one prefix is given to a request with another. The plain base matches the
replica to the request it was chosen for (Ray's experimental ConsistentHashRouter does the same).
Routing tasks still take requests in arrival order.
"""

from __future__ import annotations

import hashlib
import logging
import random
import struct
from typing import Optional, Sequence

from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

logger = logging.getLogger(__name__)

_DIGEST_BYTES = 8  # route keys and rendezvous scores are unsigned 64-bit ints


def _digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=_DIGEST_BYTES).digest()


def prefix_route_key(prompt_ids: Sequence[int], block_size: int, cache_salt: Optional[str] = None,
                     prefix_blocks: int = 4) -> Optional[int]:
    """The route key of a prompt: a hash chained over its first ``min(full blocks, prefix_blocks)``
    full blocks of ``block_size`` tokens, starting from the salt's hash when ``cache_salt`` is
    given (a salted prompt shares no key with an unsalted one, as it shares no cached block).
    None when the prompt has no full block. The same in every process and on every platform;
    an unsigned int below 2**64.

    Prompts that agree on their first ``prefix_blocks * block_size`` tokens get one key; a prompt
    with fewer full blocks gets the key of exactly those blocks, so it only shares a key with
    prompts of the same leading blocks *and* the same number of them (capped at prefix_blocks).
    """
    if block_size < 1 or prefix_blocks < 1:
        raise ValueError("block_size and prefix_blocks must be >= 1")
    num_blocks = min(len(prompt_ids) // block_size, prefix_blocks)
    if num_blocks == 0:
        return None
    parent = b"\0" * _DIGEST_BYTES if cache_salt is None else _digest(b"cache_salt:" + cache_salt.encode())
    pack = struct.Struct(f"<{block_size}q").pack  # little-endian int64 token ids: platform-independent
    for start in range(0, num_blocks * block_size, block_size):
        parent = _digest(parent + pack(*prompt_ids[start:start + block_size]))
    return int.from_bytes(parent, "big")


def rendezvous_order(key: int, replica_ids: Sequence[str]) -> list[int]:
    """Indices into ``replica_ids``, best first, by highest-random-weight score of
    ``(key, replica_id)``. A replica's score does not depend on the others, so adding or removing
    one replica changes the winner only of the keys that replica wins (or won). Equal scores (a
    2**-64 event) are broken by the replica id, so the order never depends on the input order."""
    prefix = f"{key}:".encode()
    scores = [(_digest(prefix + rid.encode()), rid, i) for i, rid in enumerate(replica_ids)]
    scores.sort(reverse=True)
    return [i for _, _, i in scores]


def _two_choices(candidates: Sequence[RunningReplica]) -> list[list[RunningReplica]]:
    # Ray's power of two choices: one rank of two distinct random replicas; the base class probes
    # (or reads cached) queue lengths and takes the shorter queue that accepts.
    n = len(candidates)
    if n == 1:
        return [[candidates[0]]]
    i = random.randrange(n)
    j = random.randrange(n - 1)
    if j >= i:
        j += 1
    return [[candidates[i], candidates[j]]]


class PrefixAffinityRouter(RequestRouter):
    """Ray Serve request router: prefix affinity by rendezvous hashing of the ``route_key``
    keyword of each handle call, guarded by queue lengths (see the module docstring).

    Configure with ``RequestRouterConfig(request_router_class=PrefixAffinityRouter,
    request_router_kwargs={"imbalance_threshold": 8, "num_fallback_replicas": 1})``.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.imbalance_threshold = 8  # open requests the preferred replica may have beyond the least
        self.num_fallback_replicas = 1  # next rendezvous replicas tried when the preferred one rejects
        # Routing decisions (choose_replicas calls, so a request retried after every rank
        # rejected counts again): by_affinity, fallback_imbalance (busier than the threshold or
        # full), no_key (no full prompt block, or no request).
        self.decisions: dict[str, int] = {"by_affinity": 0, "fallback_imbalance": 0, "no_key": 0}

    def initialize_state(self, imbalance_threshold: int = 8, num_fallback_replicas: int = 1,
                         **kwargs) -> None:
        """Called by Ray Serve with ``request_router_kwargs``."""
        if not isinstance(imbalance_threshold, int) or imbalance_threshold < 0:
            raise ValueError(f"imbalance_threshold must be an int >= 0, got {imbalance_threshold!r}")
        if not isinstance(num_fallback_replicas, int) or num_fallback_replicas < 0:
            raise ValueError(f"num_fallback_replicas must be an int >= 0, got {num_fallback_replicas!r}")
        if kwargs:
            logger.warning("PrefixAffinityRouter ignores unknown request_router_kwargs %s", sorted(kwargs))
        self.imbalance_threshold = imbalance_threshold
        self.num_fallback_replicas = num_fallback_replicas

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: Optional[PendingRequest] = None) -> list[list[RunningReplica]]:
        """Ranks of replicas to try in order: ``[[preferred], [next by rendezvous], ...]`` for a
        keyed request on a replica that is not overloaded, else one power-of-two-choices rank."""
        if not candidate_replicas:
            return []
        key = None
        if pending_request is not None:
            # Without this the base class retries at once, forever, when every rank rejects.
            pending_request.routing_context.should_backoff = True
            key = (pending_request.kwargs or {}).get("route_key")
        if key is None:
            self.decisions["no_key"] += 1
            return _two_choices(candidate_replicas)
        order = rendezvous_order(key, [r.replica_id.unique_id for r in candidate_replicas])
        preferred = candidate_replicas[order[0]]
        if self._overloaded(preferred, candidate_replicas):
            self.decisions["fallback_imbalance"] += 1
            return _two_choices(candidate_replicas)
        self.decisions["by_affinity"] += 1
        return [[candidate_replicas[i]] for i in order[:1 + self.num_fallback_replicas]]

    def _overloaded(self, preferred: RunningReplica, candidates: Sequence[RunningReplica]) -> bool:
        # Only cached queue lengths are read: probing here would add a round trip per request.
        # Unknown lengths never count as overload; the base class probes them when it selects.
        if not self._use_replica_queue_len_cache:
            return False
        cache = self._replica_queue_len_cache
        preferred_len = cache.get(preferred.replica_id)
        if preferred_len is None:
            return False
        if preferred_len >= preferred.max_ongoing_requests:
            return True
        least = preferred_len
        for replica in candidates:
            queue_len = cache.get(replica.replica_id)
            if queue_len is not None and queue_len < least:
                least = queue_len
        return preferred_len - least > self.imbalance_threshold
