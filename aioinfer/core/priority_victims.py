"""How many running requests a waiting request that outranks them must preempt to be admitted
(vLLM's priority policy; ``Scheduler._admit_outranking``). Pure: it asks the KV cache, changes nothing."""

from __future__ import annotations

from collections import Counter
from typing import Sequence

from aioinfer.core.kv_cache_manager import KVCacheManager, cdiv
from aioinfer.core.prefix_cache import BLOCK_ID
from aioinfer.core.request_queue import outranks
from aioinfer.request import Request


def num_victims_for(request: Request, running: Sequence[Request], kv: KVCacheManager, max_num_seqs: int) -> int | None:
    """The fewest requests from the back of ``running`` (the scheduling order), all outranked by
    ``request``, whose preemption lets it be admitted (0: it fits as things are); None when no number
    does."""
    # kv.admit's own test, as if the victims' blocks and reservations were released. Hits on a
    # victim's blocks need no new block but stop being free ones: they count once, not twice.
    hits = [] if request.needs_prompt_logits else kv.match_prefix(request)  # as Scheduler._admit_blocks
    need = cdiv(request.num_tokens, kv.block_size) - len(hits)
    released: Counter[int] = Counter()
    outstanding = 0
    for num_victims in range(len(running) + 1):
        if num_victims:
            victim = running[-num_victims]
            if not outranks(request, victim):
                return None
            released.update(kv.block_ids(victim.request_id))
            outstanding += kv.outstanding_blocks(victim.request_id)
        if len(running) - num_victims >= max_num_seqs:
            continue
        freed = {b for b, n in released.items() if kv.pool.ref_counts[b] == n}
        revived = sum(1 for entry in hits if kv.pool.is_free(entry[BLOCK_ID]) or entry[BLOCK_ID] in freed)
        if need + kv.num_reserved_blocks - outstanding <= kv.num_free_blocks + len(freed) - revived:
            return num_victims
    return None
