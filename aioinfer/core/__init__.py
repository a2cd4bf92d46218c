"""The scheduler and the KV cache manager: which requests run each step and how many tokens each,
the block pool, prefix caching, preemption (recompute or swap) and priorities. Pure Python with no
torch, so that every policy is tested on the CPU alone and its cost per step is the host's only."""
