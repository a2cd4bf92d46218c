"""Rank 0's handles on its spawned worker processes: start, watch, and stop them.

Each worker reports on a one-way pipe (started / failed with its traceback), so rank 0 can give
the worker's own error instead of a bare "connection closed", and never waits on a worker that is
already dead: every wait here polls ``is_alive`` and has a deadline.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from aioinfer.executor.tp_worker import FAILED, STARTED, worker_main
from aioinfer.errors import WorkerProcessError

logger = logging.getLogger(__name__)


class WorkerProcesses:
    def __init__(self) -> None:
        self.processes: list[Any] = []
        self._pipes: list[Any] = []
        self._reported: dict[int, list[tuple[str, str]]] = {}  # rank -> messages read so far

    def start(self, world_size: int, init_method: str, devices: list[str]) -> None:
        """Spawn ranks 1 .. world_size - 1; ``devices[rank]`` is each one's device ("cuda:1", "cpu")."""
        import torch.multiprocessing as mp

        ctx = mp.get_context("spawn")  # fork would copy rank 0's CUDA context and threads
        for rank in range(1, world_size):
            receive, send = ctx.Pipe(duplex=False)
            process = ctx.Process(target=worker_main, args=(rank, world_size, init_method, devices[rank], send),
                                  name=f"aioinfer-tp-rank{rank}", daemon=True)
            process.start()
            send.close()  # the child holds the only writer: its exit closes the pipe
            self.processes.append(process)
            self._pipes.append(receive)
            self._reported[rank] = []

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes]

    def wait_started(self, timeout_s: float) -> None:
        """Block until every worker has imported its modules (and is about to join the group)."""
        deadline = time.monotonic() + timeout_s
        while not all(any(kind == STARTED for kind, _ in self._read(rank)) for rank in self._reported):
            self.check()
            if time.monotonic() > deadline:
                raise WorkerProcessError(f"tensor-parallel workers did not start within {timeout_s:.0f} s")
            time.sleep(0.01)

    def check(self) -> None:
        """WorkerProcessError if a worker has exited or reported a failure."""
        failure = self.failure()
        if failure is not None:
            raise WorkerProcessError(failure)

    def failure(self, wait_s: float = 0.0) -> str | None:
        """Why the first failed worker failed (its traceback when it sent one), else None.

        ``wait_s``: after a collective broke, give a dying worker that long to be seen dead (its
        sockets close before the kernel reports the process as exited).
        """
        deadline = time.monotonic() + wait_s
        while (found := self._first_failure()) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        return found

    def _first_failure(self) -> str | None:
        for rank, process in enumerate(self.processes, start=1):
            failed = [detail for kind, detail in self._read(rank) if kind == FAILED]
            if failed or not process.is_alive():
                code = process.exitcode
                why = f"exited with code {code}" if code is not None else "reported a failure"
                detail = f":\n{failed[-1]}" if failed else ""
                return f"tensor-parallel worker rank {rank} (pid {process.pid}) {why}{detail}"
        return None

    def _read(self, rank: int) -> list[tuple[str, str]]:
        pipe = self._pipes[rank - 1]
        try:
            while pipe.poll():
                self._reported[rank].append(pipe.recv())
        except (EOFError, OSError):
            pass  # the worker is gone; is_alive says so
        return self._reported[rank]

    def stop(self, timeout_s: float = 30.0) -> None:
        """Join every worker (they exit after the stop sentinel); terminate, then kill, the ones that do not."""
        deadline = time.monotonic() + timeout_s
        for process in self.processes:
            process.join(max(0.0, deadline - time.monotonic()))
        for process in self.processes:
            if process.is_alive():
                if timeout_s > 0:
                    logger.warning("tensor-parallel worker pid %d did not exit; terminating it", process.pid)
                process.terminate()
                process.join(5.0)
            if process.is_alive():
                process.kill()
                process.join(5.0)
        for pipe in self._pipes:
            pipe.close()
