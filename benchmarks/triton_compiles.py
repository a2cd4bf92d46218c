"""Which Triton kernels were JIT-compiled (or loaded from the disk cache) inside a region.

A kernel variant first met while a benchmark is timing adds its compile (~0.5 s on the H200) to the
result; the benchmarks record these so that a slow run says why. Uses Triton's
``knobs.runtime.jit_post_compile_hook`` (Triton >= 3.4); older Triton records nothing (``None``).
"""

from __future__ import annotations

from typing import Any, Optional


class TritonCompiles:
    """``with TritonCompiles() as c: ...``; then ``c.names`` lists the kernel variants compiled inside."""

    def __init__(self) -> None:
        self.names: Optional[list[str]] = None
        self._runtime: Any = None
        self._previous: Any = None

    def __enter__(self) -> "TritonCompiles":
        try:
            from triton import knobs
        except ImportError:
            return self
        self.names = []
        self._runtime = knobs.runtime
        self._previous = self._runtime.jit_post_compile_hook

        def hook(*args: Any, **kwargs: Any) -> Any:
            fn = kwargs.get("fn")
            self.names.append(getattr(fn, "name", None) or str(kwargs.get("repr", "?"))[:80])
            return self._previous(*args, **kwargs) if self._previous else None

        self._runtime.jit_post_compile_hook = hook
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._runtime is not None:
            self._runtime.jit_post_compile_hook = self._previous

    @property
    def count(self) -> Optional[int]:
        return None if self.names is None else len(self.names)
