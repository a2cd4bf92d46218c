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
"""

import atexit
import faulthandler
import multiprocessing
import os
import signal
import subprocess
import sys

_CLEAN = b"\0"  # the worker's last word when it exits normally


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

    def clean_exit() -> None:
        faulthandler.disable()
        os.write(write, _CLEAN)
        os.close(write)

    atexit.register(clean_exit)


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


def _end_hypercorn(hypercorn: int, worker: int, why: str) -> None:
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
    sys.stderr.write(f"aioinfer: the server worker (pid {worker}) {why}; ended hypercorn's main process "
                     f"(pid {hypercorn}) with SIGKILL, as it would otherwise have exited with status 0\n")
    sys.stderr.flush()


if __name__ == "__main__":
    sys.exit(_watch(int(sys.argv[1]), int(sys.argv[2])))
