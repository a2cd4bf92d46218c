"""A fatal signal in the server (a crash in native code: SIGSEGV, SIGABRT, SIGBUS, SIGILL, SIGFPE) must
leave a line in the log and a failing exit status, so that a supervisor that restarts on failure does.

The log line is faulthandler's: every thread's Python stack, written from the signal handler. The
status is the hard part: ``hypercorn aioinfer.app:app`` serves from a worker process, and hypercorn
0.18's main process exits 0 whenever that worker dies (its ``run`` recomputes the exit code from the
workers it has already reaped, none). So in such a worker, faulthandler writes to a pipe read by a
small watcher process (this file run as a script: it imports nothing but the standard library),
which copies the report to the log and, at its first byte (before the worker has finished dying, so
before hypercorn can exit), kills hypercorn's main process with SIGKILL: status 137, never 0 (and
its other workers, if any, with SIGTERM: they would keep the port). A worker that ends normally
writes ``_CLEAN`` first; one that vanishes without a word (SIGKILL, the OOM killer) gets the same
treatment, on a best effort (hypercorn may be quicker). ``python -m aioinfer serve`` runs hypercorn
in its own process and needs only faulthandler.

The same trap catches a worker that exits on purpose with a failing status (a bad setting found when
``aioinfer.app`` is imported, a model that cannot load): hypercorn would exit 0 there too. Such a
worker ends the server with ``end_server``, which writes its one line, ends hypercorn's main process
itself (the same ``_end_hypercorn``, silently: the line has said why), and only then exits. The
worker does it rather than the watcher because it is alive and can do it before exiting: nothing
races hypercorn's exit. The shell sees 137 (SIGKILL), the only status left to a process that runs
none of our code; ``serve`` exits with the status itself (2 for a setting, 1 for a load failure).
"""

import atexit
import faulthandler
import multiprocessing
import os
import signal
import subprocess
import sys
from typing import NoReturn, Optional

_CLEAN = b"\0"  # the worker's last word when it exits normally
# In a watched hypercorn worker: (hypercorn's main process, the pipe to the watcher); else None
_watched: Optional[tuple[int, int]] = None


def report_fatal_signals() -> None:
    """faulthandler on; in a hypercorn worker, through the watcher (module docstring)."""
    parent = multiprocessing.parent_process()
    if parent is None or not _is_hypercorn(parent.pid):
        faulthandler.enable(all_threads=True)
        return
    read, write = os.pipe()
    try:
        subprocess.Popen([sys.executable, "-I", os.path.abspath(__file__), str(parent.pid), str(os.getpid())],
                         stdin=read, close_fds=True, start_new_session=True)
    except OSError:
        os.close(write)
        faulthandler.enable(all_threads=True)
        return
    finally:
        os.close(read)
    faulthandler.enable(file=write, all_threads=True)
    global _watched
    _watched = (parent.pid, write)
    atexit.register(_clean_exit)


def _clean_exit() -> None:
    """Tell the watcher this exit is no crash (once: ``end_server`` and atexit may both call it)."""
    global _watched
    if _watched is None:
        return
    faulthandler.disable()
    _, write = _watched
    _watched = None
    os.write(write, _CLEAN)
    os.close(write)


def end_server(status: int, line: str, *, now: bool = False) -> NoReturn:
    """Write ``line`` on stderr and end the server process with ``status``; in a hypercorn worker,
    hypercorn's main process first (module docstring), so that the server's status is never 0.

    ``now``: ``os._exit`` (from the event loop, with the engine's threads about); otherwise
    ``SystemExit``, as at import. A hypercorn worker always leaves with ``os._exit``, at once, since
    hypercorn's main process is already gone and the port must be let go.
    """
    sys.stderr.write(line.rstrip("\n") + "\n")
    sys.stderr.flush()
    watched = _watched
    if watched is not None:
        _release_semaphores()
        _end_hypercorn(watched[0], os.getpid(), None)
        _clean_exit()
    if now or watched is not None:
        sys.stdout.flush()
        os._exit(status)
    raise SystemExit(status)


def _release_semaphores() -> None:
    """Unlink the named semaphores of the shutdown Event that hypercorn's main process made for this
    worker (its Process arguments, which the worker holds too). Killed, that process cannot unlink
    them; multiprocessing's resource tracker then would, and warn of "leaked semaphore objects" on
    stderr after the shell has returned. Best effort: a Python whose internals differ leaves them
    to the tracker."""
    try:
        from multiprocessing import current_process
        from multiprocessing.synchronize import SemLock

        def semlocks(obj: object, depth: int):  # Event -> Condition -> its lock and Semaphores
            if isinstance(obj, SemLock):
                yield obj
            elif depth:
                for value in getattr(obj, "__dict__", {}).values():
                    yield from semlocks(value, depth - 1)

        names = {lock._semlock.name for value in getattr(current_process(), "_kwargs", {}).values()
                 for lock in semlocks(value, 3)}
        for name in names - {None}:
            SemLock._cleanup(name)
    except Exception:  # noqa: BLE001 - only a warning's worth is at stake
        pass


def _is_hypercorn(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"hypercorn" in f.read()
    except OSError:  # not Linux: the watcher is not started (faulthandler still reports to stderr)
        return False


def _watch(hypercorn: int, worker: int) -> int:
    """The watcher: reads the worker's pipe until it closes (stdin)."""
    report = b""
    while True:
        chunk = os.read(0, 1 << 16)
        if not chunk:
            break
        if not report and chunk.startswith(_CLEAN):
            return 0
        if not report:
            _end_hypercorn(hypercorn, worker, "died of a fatal signal (its threads' stacks follow)")
        report += chunk
        os.write(2, chunk)
    if not report:
        _end_hypercorn(hypercorn, worker, "vanished without exiting (killed?)")
    return 0


def _end_hypercorn(hypercorn: int, worker: int, why: Optional[str]) -> None:
    try:  # its other workers (--workers N) would outlive it, and keep the port: they are ended too
        with open(f"/proc/{hypercorn}/task/{hypercorn}/children") as f:
            others = [int(pid) for pid in f.read().split() if int(pid) != worker]
    except OSError:
        others = []
    try:
        os.kill(hypercorn, signal.SIGKILL)
    except OSError:
        pass
    for pid in others:
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            pass
    if why is None:  # the worker itself, which has said why
        return
    sys.stderr.write(f"aioinfer: the server worker (pid {worker}) {why}; ended hypercorn's main process "
                     f"(pid {hypercorn}) with SIGKILL, as it would otherwise have exited with status 0\n")
    sys.stderr.flush()


if __name__ == "__main__":
    sys.exit(_watch(int(sys.argv[1]), int(sys.argv[2])))
