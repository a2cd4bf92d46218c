"""The threads that compile constraints into llguidance matchers: a large stack, a low priority, a
bounded number, and a caller that waits no longer than its budget.

Why threads of their own, rather than the caller's (an anyio worker thread, the event loop, the
offline ``LLM``'s pool):

- Stack. llguidance compiles by recursion on the calling thread (limits.py): a Python thread's
  stack is the process default (8 MiB here), and its overflow is a SIGSEGV that ends the server.
  These threads are made with ``STACK_BYTES`` (256 MiB of address space; only the pages a deep
  compile touches become memory), far above what the bounds of limits.py let a compile reach.
- Starvation. A compile can take seconds of CPU (a Lark rule of 50,000 alternatives: 4.8 s on
  this machine; 100,000: 10 s, then a panic), and eight at once took a two-core server's normal
  requests from 1 s to 8-12 s. Here at most ``threads`` compiles run at once, each on a thread
  whose nice value is raised by ``NICE`` (Linux sets it per thread), so that the step loop and the
  event loop, at the default priority, win the CPU from them. llguidance drops the GIL while it
  builds a matcher, so the priority is what counts.
- Budget. ``run`` waits at most ``timeout`` seconds. A thread cannot be stopped, so a compile that
  overruns finishes in the background (its work is bounded: limits.py, llguidance's own limits)
  while its caller has its answer: ``CompileTimeout`` if it had started, ``CompileBusy`` if every
  thread was still busy with others (then it never starts).
- Exit. The threads are daemons (a pool never holds a process open), but none may still be inside
  llguidance when the interpreter finalizes: a daemon thread that wants the GIL back then is ended
  with pthread_exit, whose unwind through llguidance's Rust frames aborts the process ("FATAL:
  exception not rethrown", status 134). So at interpreter exit, before daemon threads are left to
  themselves, every pool's threads are told to stop and joined, for at most ``EXIT_WAIT`` seconds
  (a compile in progress finishes: limits.py bounds it).
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import queue
import threading
import time
import weakref
from typing import Any, Callable, Optional

logger = logging.getLogger(__name__)

STACK_BYTES = 256 << 20
NICE = 10  # added to the process's nice value: 10 gives a thread about a tenth of a contended CPU
EXIT_WAIT = 30.0  # seconds the interpreter's exit waits, in all, for compiles still running


class CompileTimeout(Exception):
    """The compile started but did not finish within the caller's budget (it goes on in the background)."""


class CompileBusy(Exception):
    """Every compile thread stayed busy with other compiles for the whole budget; this one never started."""


class CompileThreads:
    def __init__(self, threads: int) -> None:
        self.size = max(1, threads)
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        # Dropped (its engine gone): the threads end; they hold the queue, not this object.
        weakref.finalize(self, _stop, self._jobs, self._threads)
        _pools.add(self)

    def run(self, fn: Callable[..., Any], *args: Any, timeout: float) -> Any:
        """``fn(*args)`` on a compile thread; its result or exception, or CompileTimeout / CompileBusy."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._start_threads()
        self._jobs.put((fn, args, future))
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            if future.cancel():  # still queued: the thread that takes it skips it
                raise CompileBusy() from None
            raise CompileTimeout() from None

    def _start_threads(self) -> None:
        if len(self._threads) >= self.size:
            return
        with self._lock:
            while len(self._threads) < self.size:
                thread = threading.Thread(target=_serve, args=(self._jobs,), daemon=True,
                                          name=f"aioinfer-grammar-compile-{len(self._threads)}")
                _start_with_stack(thread, STACK_BYTES)
                self._threads.append(thread)


_stack_lock = threading.Lock()  # threading.stack_size is process-wide: set it only around our start()


def _start_with_stack(thread: threading.Thread, size: int) -> None:
    with _stack_lock:
        try:
            previous = threading.stack_size(size)
        except (ValueError, RuntimeError) as exc:  # a platform that refuses the size
            logger.warning("structured outputs: compile threads keep the default stack (%s)", exc)
            thread.start()
            return
        try:
            thread.start()
        except RuntimeError as exc:  # no address space for it (strict overcommit): the default stack
            logger.warning("structured outputs: a compile thread keeps the default stack (%s)", exc)
            threading.stack_size(previous)
            thread.start()
        finally:
            threading.stack_size(previous)


def _stop(jobs: queue.SimpleQueue, threads: list) -> None:
    for _ in threads:
        jobs.put(None)


_pools: "weakref.WeakSet[CompileThreads]" = weakref.WeakSet()


def _join_at_exit() -> None:
    """Stop every pool's threads and wait for them (module docstring, Exit)."""
    threads = []
    for pool in list(_pools):
        with pool._lock:
            _stop(pool._jobs, pool._threads)
            threads += pool._threads
            pool.size = 0  # no new threads from a late caller
    deadline = time.monotonic() + EXIT_WAIT
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))


# Run by threading._shutdown at interpreter exit, first of the exit hooks (as concurrent.futures' pools do).
threading._register_atexit(_join_at_exit)


def _serve(jobs: queue.SimpleQueue) -> None:
    _lower_priority()
    while (job := jobs.get()) is not None:
        fn, args, future = job
        if not future.set_running_or_notify_cancel():
            continue  # its caller gave up while it was queued
        try:
            future.set_result(fn(*args))
        except BaseException as exc:  # noqa: BLE001 - the caller raises it
            future.set_exception(exc)
        job = fn = args = future = None  # a finished job's matchers are not kept alive by this frame


def _lower_priority() -> None:
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), min(19, os.getpriority(os.PRIO_PROCESS, 0) + NICE))
    except (AttributeError, OSError):  # not Linux, or not allowed: the default priority
        pass


def default_compile_threads(cpus: Optional[int] = None) -> int:
    """Two to eight: the offline ``LLM`` builds a batch's matchers side by side on up to eight."""
    return max(2, min(8, cpus or os.cpu_count() or 1))
