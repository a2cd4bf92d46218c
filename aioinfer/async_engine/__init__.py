"""The async ``Engine`` and its bridge to the GPU thread: admission, per-request channels, the
loop bridge, the step loop (the GPU thread's loop) and the records observers receive.

Nothing is imported here on purpose: ``metrics.py``, ``request_log.py`` and ``worker/swap.py``
import ``stats`` alone, which must not pull in the engine (and torch) with it.
"""
