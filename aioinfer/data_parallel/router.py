"""Which replica of a data-parallel engine takes a request: the least loaded one, unless another
recently served the same prompt prefix and is not much busier. Pure Python (no torch, no I/O).

Load is counted in tokens a replica still owes its open requests: prompt tokens not yet computed
plus output tokens not yet generated. EOS cannot be foreseen, so the output part is bounded by the
request's ``max_tokens`` and, for requests that leave it open (the rest of the context), by
``max_output_estimate``: a chat without ``max_tokens`` must not count as 30k tokens of work.
Equal loads are broken by fewer open requests, then by the lower replica index, so the same
sequence of requests is always routed the same way.

Prefix affinity: a prompt's full blocks (``block_size`` tokens, the KV cache's unit) are hashed as
a chain (each hash covers the block and everything before it, as the prefix cache does), and a
bounded LRU map remembers, per block hash, the replica that last served a prompt with that
prefix. Once the engine caches prefixes, the replica with the longest matching run of leading
blocks can skip that much prefill. It gets the request unless its load exceeds the least load by
more than the margin ``max(affinity_margin_tokens, affinity_margin_ratio x least load)``: past
that, queueing behind the busier replica costs more than recomputing the prefix elsewhere.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Optional, Sequence


@dataclass(slots=True)
class ReplicaLoad:
    requests: int = 0  # open requests routed to the replica
    tokens: int = 0  # outstanding tokens of those requests (see the module docstring)


@dataclass(frozen=True, slots=True)
class Route:
    replica: int
    matched_blocks: int  # leading prompt blocks the chosen replica recently served (0: none)
    by_affinity: bool  # True: chosen for its prefix although another replica had less load


class Router:
    def __init__(self, num_replicas: int, block_size: int, *, max_prefix_entries: int = 1 << 16,
                 affinity_margin_tokens: int = 4096, affinity_margin_ratio: float = 0.25,
                 max_output_estimate: int = 2048) -> None:
        if num_replicas < 1 or block_size < 1 or max_prefix_entries < 1 or max_output_estimate < 1:
            raise ValueError("num_replicas, block_size, max_prefix_entries and max_output_estimate must be >= 1")
        if affinity_margin_tokens < 0 or affinity_margin_ratio < 0:
            raise ValueError("affinity margins must be >= 0")
        self.block_size = block_size
        self.max_prefix_entries = max_prefix_entries  # block hashes remembered (about 16 bytes of key each)
        self.affinity_margin_tokens = affinity_margin_tokens
        self.affinity_margin_ratio = affinity_margin_ratio
        self.max_output_estimate = max_output_estimate  # tokens
        self.loads = [ReplicaLoad() for _ in range(num_replicas)]
        self._prefix_owner: OrderedDict[int, int] = OrderedDict()  # chained block hash -> replica, LRU order

    # ---------------------------------------------------------------- choosing

    def block_hashes(self, prompt_token_ids: Sequence[int], cache_salt: Optional[str] = None) -> list[int]:
        """Chained hashes of the prompt's full blocks; a partial last block is left out. A salted
        request's chain starts from its salt, as in the engines' prefix caches: it only matches
        prompts with the same salt."""
        hashes: list[int] = []
        parent = 0 if cache_salt is None else hash(("cache_salt", cache_salt))
        bs = self.block_size
        for start in range(0, len(prompt_token_ids) - bs + 1, bs):
            # Python's hash of a tuple of ints is deterministic (no per-process salt, unlike str).
            parent = hash((parent, tuple(prompt_token_ids[start:start + bs])))
            hashes.append(parent)
        return hashes

    def choose(self, block_hashes: Sequence[int], eligible: Sequence[bool]) -> Optional[Route]:
        """The replica for a request with these prompt block hashes, among the eligible ones
        (ready, alive, with admission room); None when no replica is eligible."""
        candidates = [i for i, ok in enumerate(eligible) if ok]
        if not candidates:
            return None
        least = min(candidates, key=self._order)
        # Deepest leading block each eligible replica served last; the chain stops at the first
        # block nobody remembers (later blocks cannot match a prefix that is not there).
        best, best_depth = least, 0
        for depth, block_hash in enumerate(block_hashes, start=1):
            owner = self._prefix_owner.get(block_hash)
            if owner is None:
                break
            if eligible[owner]:
                best, best_depth = owner, depth
        if best_depth == 0 or best == least:
            return Route(least, best_depth if best == least else 0, by_affinity=False)
        least_tokens = self.loads[least].tokens
        margin = max(self.affinity_margin_tokens, self.affinity_margin_ratio * least_tokens)
        if self.loads[best].tokens - least_tokens <= margin:
            return Route(best, best_depth, by_affinity=True)
        return Route(least, 0, by_affinity=False)

    def _order(self, replica: int) -> tuple[int, int, int]:
        load = self.loads[replica]
        return (load.tokens, load.requests, replica)

    # ---------------------------------------------------------------- bookkeeping

    def record(self, block_hashes: Sequence[int], replica: int) -> None:
        """Remember that ``replica`` now holds this prefix (the most recent server wins)."""
        owners = self._prefix_owner
        for block_hash in block_hashes:
            owners[block_hash] = replica
            owners.move_to_end(block_hash)
        while len(owners) > self.max_prefix_entries:
            owners.popitem(last=False)

    def outstanding_tokens(self, prompt_tokens_pending: int, output_tokens_left: int) -> int:
        return prompt_tokens_pending + min(max(output_tokens_left, 0), self.max_output_estimate)

    def add(self, replica: int, tokens: int) -> None:
        """A request was admitted on ``replica`` with ``tokens`` outstanding."""
        load = self.loads[replica]
        load.requests += 1
        load.tokens += tokens

    def adjust(self, replica: int, delta_tokens: int) -> None:
        """An open request's outstanding tokens changed by ``delta_tokens`` (it made progress)."""
        self.loads[replica].tokens += delta_tokens

    def remove(self, replica: int, tokens: int) -> None:
        """A request ended (finished, aborted or failed) with ``tokens`` still counted."""
        load = self.loads[replica]
        load.requests -= 1
        load.tokens -= tokens
        assert load.requests >= 0 and load.tokens >= 0, load  # every add has exactly one remove
