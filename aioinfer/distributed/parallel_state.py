"""vLLM's ``cleanup_dist_env_and_memory``, for scripts that call it between two engines (its
prefix-caching example does): here an engine releases its worker processes and memory itself
(``LLM.shutdown`` or its finalizer), so what is left is to collect the dropped one and give the
CUDA allocator's cached blocks back."""

from __future__ import annotations

from aioinfer.utils.dropped_memory import release_dropped_memory


def cleanup_dist_env_and_memory(shutdown_ray: bool = False) -> None:
    """Collect dropped engines and empty the CUDA cache (``shutdown_ray``: accepted; there is no Ray)."""
    release_dropped_memory()
