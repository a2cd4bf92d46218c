"""A Triton kernel launched every step outside a CUDA graph, through the compiled kernel its first
launch made (``CompiledLaunch``).

``kernel[grid](*args)`` binds the arguments, computes Triton's specialization and cache key, checks
the kernel's globals and asks for the device and stream, all in Python, before its C launcher
runs: about 20 µs in a hot loop, and the structured-output apply (one launch a constrained step)
took 0.11 ms of the engine thread's step on a slow H200 host (a per-step trace, 2026-12-04),
where the engine thread's Python bounds the step. Here the first
launch for a set of arguments goes through the JIT (compiling if need be) and keeps the
``CompiledKernel`` it returns; later launches with the same key call that kernel's launcher
directly (``CompiledKernel[grid]``, Triton's own form for a compiled kernel), with the current
stream. In one engine the constrained 0.5b run gave 0.916 of the free throughput with it against
0.896 through the JIT (10 rounds), and 0.903 against 0.902 in a later call (12 rounds; H200,
2026-12-04).

The key is finer than any specialization Triton makes, so a kept kernel is always one the JIT
would have chosen: integer and other scalar arguments by value (Triton specializes integers on
being 1 and on divisibility by 16; a constexpr by its value), tensors by dtype, device and whether
their address is a multiple of 16 (Triton's pointer specialization). Keys made by arguments that
change every launch (a float, say) would never be found again: past ``MAX_KEPT`` kernels, new keys
launch through the JIT.
"""

from __future__ import annotations

from typing import Any

import torch

MAX_KEPT = 64  # kernels kept per CompiledLaunch
_TRITON_OK: bool | None = None


def triton_available() -> bool:
    """Whether Triton imports (asked once): a CUDA machine without it still runs, through torch ops."""
    global _TRITON_OK
    if _TRITON_OK is None:
        try:
            import triton  # noqa: F401
            _TRITON_OK = True
        except ImportError:
            _TRITON_OK = False
    return _TRITON_OK


class CompiledLaunch:
    """``launch(grid, *args)``: ``jit_fn[grid](*args)`` with every argument positional, in the kernel's
    order (constexprs too, as the compiled launcher takes them)."""

    def __init__(self, jit_fn: Any) -> None:
        from triton.runtime.driver import driver
        from triton.runtime.jit import JITFunction

        self._jit_fn = jit_fn
        self._driver = driver
        # Triton's interpreter (TRITON_INTERPRET=1, CPU tensors in tests) makes no compiled kernel.
        self._interpreted = not isinstance(jit_fn, JITFunction)
        self._compiled: dict[tuple, Any] = {}
        self.num_direct = 0  # launches through a kept kernel (tests)

    def __call__(self, grid: tuple, *args: Any) -> None:
        if self._interpreted:
            self._jit_fn[grid](*args)
            return
        active = self._driver.active
        device = active.get_current_device()
        key = (device,) + tuple(map(_key_of, args))
        compiled = self._compiled.get(key)
        if compiled is None:
            compiled = self._jit_fn[grid](*args)  # compiles (or finds) it, and launches it
            if compiled is not None and len(self._compiled) < MAX_KEPT:
                self._compiled[key] = compiled
            return
        # The compiled kernel's launcher takes three grid dimensions (the JIT fills in the missing ones).
        compiled[grid + (1,) * (3 - len(grid))](*args, stream=active.get_current_stream(device))
        self.num_direct += 1

    @property
    def num_compiled(self) -> int:
        """Kernels kept (one a key; tests)."""
        return len(self._compiled)


def _key_of(arg: Any) -> Any:
    if isinstance(arg, torch.Tensor):
        return (arg.dtype, arg.device, arg.data_ptr() % 16 == 0)
    return (type(arg), arg)
