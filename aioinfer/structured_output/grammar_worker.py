"""The thread that computes a step's token masks while the engine thread goes on (grammar_mask.py).

llguidance computes without the GIL, in its own threads; the thread that calls it needs the GIL
only to take a job, between llguidance's two calls (the matchers take the last tokens, then the
masks follow them) and after them. Every such moment is a handoff from the engine thread, which is
busy in Python and gives the GIL up only at its next blocking call (any torch call) or after the
interpreter's switch interval: each cost the engine thread a forced switch and a wait to get the
GIL back. So this thread does nothing else: the buffers, the masks' copy to the device and the
timings' bookkeeping are the engine thread's (an H200 probe, 2026-12-02: the worker's own torch
calls for the copy took the GIL about four more times a step and cost the 0.5b constrained step
more than llguidance did). A thread at all, rather than the engine thread
calling llguidance itself (the GIL released while llguidance computes, but the engine thread waiting
for it): in one H200 engine that gave 0.756 of the free throughput for the matchers' advance on the
engine thread and 0.732 for the masks too, against 0.832 with this thread and its turns
(2026-12-04).

The thread also owns the executor's making, so that llguidance's pool inherits the CPUs the
process had when the runner was built, not the one CPU a ``host_cpu`` engine thread is pinned to.
"""

from __future__ import annotations

import os
import queue
import sys
import threading
import time
import weakref
from typing import Optional


class MaskJob:
    """One step's work for the thread: ``live`` (matcher, token) pairs to consume, then the masks of
    ``plain`` (matcher, row) and ``with_drafts`` (matcher, first row, drafts) written at ``ptr``.
    ``done`` is held until the thread has finished with it."""

    __slots__ = ("live", "plain", "with_drafts", "ptr", "row_bytes", "num_rows", "done", "rejected",
                 "error", "started", "finished")

    def __init__(self, live, plain, with_drafts, ptr: int, row_bytes: int, num_rows: int) -> None:
        self.live, self.plain, self.with_drafts = live, plain, with_drafts
        self.ptr, self.row_bytes, self.num_rows = ptr, row_bytes, num_rows
        self.done = threading.Lock()
        self.done.acquire()
        self.rejected: Optional[list] = None  # consume's answers, kept only when one was False
        self.error: Optional[BaseException] = None
        self.started = self.finished = 0.0  # perf_counter in the thread: the job's start and end

    def is_done(self) -> bool:
        return not self.done.locked()

    def wait(self) -> None:
        """Block (without the GIL) until the thread has finished the job; raise what it raised."""
        if self.done.locked():
            self.done.acquire()
            self.done.release()
        if self.error is not None:
            raise self.error


class GrammarWorker:
    """A thread that runs ``MaskJob``s one at a time with one ``llguidance.LLExecutor``; ``executor``
    is also the caller's to use while no job runs."""

    def __init__(self, threads: Optional[int], cpus: Optional[set], handoff: "ShortSwitchInterval") -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._handoff = handoff
        ready = threading.Event()
        made: list = []  # the executor, or what its making raised (the thread holds no reference to self)
        self._thread = threading.Thread(target=_serve, args=(self._jobs, threads, cpus, handoff, ready, made),
                                        name="aioinfer-grammar", daemon=True)
        self._thread.start()
        ready.wait()
        if isinstance(made[0], BaseException):
            raise made[0]
        self.executor = made[0]
        # Garbage-collected without ``close`` (an engine dropped): the thread still ends.
        weakref.finalize(self, self._jobs.put, None)
        _workers[self._thread] = self._jobs

    def submit(self, job: MaskJob) -> None:
        """Start ``job``; the interpreter's switch interval stays short until the thread is done with it."""
        self._handoff.enter()
        self._jobs.put(job)

    def close(self) -> None:
        """Let the thread end (after the job it may be running); idempotent."""
        self._jobs.put(None)


# Every worker thread and its queue, for the interpreter's exit: a daemon thread inside llguidance
# then would be ended with pthread_exit when it wants the GIL back, whose unwind through Rust frames
# aborts the process ("FATAL: exception not rethrown"); so each is told to stop and joined first
# (a job takes milliseconds), by threading._shutdown, before daemon threads are left to themselves.
_workers: "weakref.WeakKeyDictionary[threading.Thread, queue.SimpleQueue]" = weakref.WeakKeyDictionary()
EXIT_WAIT = 10.0


def _join_at_exit() -> None:
    items = list(_workers.items())
    for _, jobs in items:
        jobs.put(None)
    deadline = time.monotonic() + EXIT_WAIT
    for thread, _ in items:
        thread.join(max(0.0, deadline - time.monotonic()))


threading._register_atexit(_join_at_exit)


def _serve(jobs: queue.SimpleQueue, threads: Optional[int], cpus: Optional[set], handoff: "ShortSwitchInterval",
           ready: threading.Event, made: list) -> None:
    try:
        if cpus and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, cpus)
        import llguidance

        executor = llguidance.LLExecutor(threads)
    except BaseException as error:  # the caller raises it
        made.append(error)
        ready.set()
        return
    made.append(executor)
    ready.set()
    consume, masks = executor.consume_token_par, executor.unsafe_compute_mask_ptr
    masks_with_drafts = executor.unsafe_compute_mask_ptr_with_draft_token
    clock = time.perf_counter
    while (job := jobs.get()) is not None:
        job.started = clock()
        try:
            if job.live:
                accepted = consume(job.live)
                if not all(accepted):
                    job.rejected = accepted
            if job.plain:
                masks(job.plain, job.ptr, job.row_bytes, job.num_rows)
            if job.with_drafts:
                masks_with_drafts(job.with_drafts, job.ptr, job.row_bytes, job.num_rows)
        except BaseException as error:
            job.error = error
        finally:
            handoff.exit()
            job.finished = clock()
            job.done.release()


class ShortSwitchInterval:
    """The interpreter's switch interval lowered while a worker must take the GIL from a busy thread
    (nested: engines of one process share it); the caller's value comes back when the last one exits.
    A thread waiting for the GIL asks its holder to drop it after this interval: 50 µs instead of
    5 ms, for the fraction of a millisecond a step the worker needs it. It costs nothing while the
    worker is inside llguidance: only a thread waiting for the GIL asks for it."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._lock = threading.Lock()
        self._holders = 0
        self._saved = 0.0

    def enter(self) -> None:
        with self._lock:
            if self._holders == 0:
                self._saved = sys.getswitchinterval()
                sys.setswitchinterval(min(self.seconds, self._saved))
            self._holders += 1

    def exit(self) -> None:
        with self._lock:
            self._holders -= 1
            if self._holders == 0:
                sys.setswitchinterval(self._saved)


HANDOFF = ShortSwitchInterval(50e-6)
