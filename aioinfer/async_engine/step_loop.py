"""The step loop on its dedicated GPU thread.

All model and CUDA work happens here: the engine core is built on this thread and used only from
it. The event loop talks to it through a thread-safe inbox (commands applied at step boundaries)
and receives each step's results through ``deliver``, a blocking call into the event loop
(``anyio.from_thread.run_sync``) that waits for the loop, never for a client.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Union

from aioinfer.async_engine.host_cpu import pin_this_thread
from aioinfer.async_engine.stats import StepStats
from aioinfer.core.scheduler_output import EngineCoreOutput
from aioinfer.engine.engine_core import EngineCore
from aioinfer.request import Request, RequestStatus

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class AddRequest:
    request: Request


@dataclass(frozen=True, slots=True)
class FinishRequests:
    request_ids: tuple[str, ...]
    status: RequestStatus = RequestStatus.FINISHED_ABORTED


@dataclass(frozen=True, slots=True)
class Stop:
    pass


Command = Union[AddRequest, FinishRequests, Stop]


@dataclass(slots=True)
class StepResult:
    """Sent to the event loop after each step (and after commands that rejected requests)."""

    outputs: list[EngineCoreOutput]
    started: list[str] = field(default_factory=list)  # requests scheduled for the first time this step
    step_start: float = 0.0  # time.monotonic() when the step began
    rejected: list[tuple[str, Exception]] = field(default_factory=list)  # (request id, why) at admission
    stats: Optional[StepStats] = None


class StepLoop:
    def __init__(self, make_core: Callable[[], EngineCore], deliver: Callable[[StepResult], None],
                 on_loaded: Callable[[Optional[EngineCore], Optional[BaseException]], None],
                 on_dead: Callable[[BaseException], None], fault_inject_step: Optional[int] = None,
                 host_cpu: Optional[int] = None) -> None:
        self._make_core = make_core
        self._host_cpu = host_cpu  # pin this thread there once the model has loaded (host_cpu.py)
        self._deliver = deliver
        self._on_loaded = on_loaded
        self._on_dead = on_dead
        self._fault_inject_step = fault_inject_step  # tests: raise inside the loop at this step number
        self._inbox: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="aioinfer-gpu", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def submit(self, command: Command) -> None:
        """Thread-safe and non-blocking: the command is applied at the next step boundary."""
        self._inbox.put(command)

    def _run(self) -> None:
        _name_os_thread(self.thread.name)
        try:
            core = self._make_core()
        except BaseException as exc:  # noqa: BLE001 - reported to the event loop, which raises it
            self._on_loaded(None, exc)
            return
        if self._host_cpu is not None:
            # After the load: threads the CUDA driver (or torch) started meanwhile keep every CPU.
            pin_this_thread(self._host_cpu)
        self._on_loaded(core, None)
        try:
            self._loop(core)
        except BaseException as exc:  # noqa: BLE001 - every open request must hear of it
            logger.exception("engine step loop failed")
            _release_everything(core)
            try:
                self._on_dead(exc)
            except RuntimeError:
                pass  # the event loop is already gone
        finally:
            core.shutdown()  # tensor parallel: stop and join the worker processes

    def _loop(self, core: EngineCore) -> None:
        steps = 0
        while True:
            rejected: list[tuple[str, Exception]] = []
            # Idle: sleep until a command arrives. Busy: take whatever is queued, without waiting.
            block = not core.has_unfinished()
            while True:
                try:
                    command = self._inbox.get(block=block)
                except queue.Empty:
                    break
                block = False
                if isinstance(command, Stop):
                    _release_everything(core)
                    return
                self._apply(core, command, rejected)
            if not core.has_unfinished():
                # Nothing to run, but commands changed the state (aborts freed blocks): report it, so
                # that metrics read "idle, cache free" without waiting for another step.
                self._deliver(StepResult(outputs=[], rejected=rejected, stats=_idle_stats(core)))
                continue

            steps += 1
            if self._fault_inject_step is not None and steps >= self._fault_inject_step:
                raise RuntimeError(f"injected failure at step {steps}")
            start = time.monotonic()
            scheduler_output, runner_output, outputs = core.step_with_details()
            self._deliver(StepResult(
                outputs=outputs,
                started=[new.request_id for new in scheduler_output.new_requests],
                step_start=start,
                rejected=rejected,
                stats=StepStats.of_step(core, scheduler_output, runner_output, time.monotonic() - start,
                                        swaps=core.take_swap_timings()),
            ))

    @staticmethod
    def _apply(core: EngineCore, command: Command, rejected: list[tuple[str, Exception]]) -> None:
        if isinstance(command, AddRequest):
            try:
                core.add_request(command.request)
            except ValueError as exc:  # checked on the event loop already; a race or a bug lands here
                rejected.append((command.request.request_id, exc))
        elif isinstance(command, FinishRequests):
            core.finish_requests(list(command.request_ids), command.status)


def _name_os_thread(name: str) -> None:
    """Give the GPU thread its name in the OS too (Linux), so that top, py-spy and the benchmarks'
    per-thread CPU split (benchmarks/proc_cpu.py) can tell it from the event loop's thread."""
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as comm:
            comm.write(name[:15])  # the kernel keeps 15 bytes
    except OSError:
        pass  # not Linux, or no /proc: a cosmetic loss


def _idle_stats(core: EngineCore) -> StepStats:
    return StepStats(num_running=0, num_waiting=0, kv_usage=core.kv_cache.usage(), num_batched_requests=0,
                     num_scheduled_tokens=0, num_generation_tokens=0, num_preempted=0, step_time=0.0)


def _release_everything(core: EngineCore) -> None:
    """Abort whatever is left so that the pool's bookkeeping ends clean (best effort after a failure)."""
    try:
        core.finish_requests(list(core.scheduler.requests))
        core.drain()  # a step launched ahead (async scheduling): wait for it, drop its results
    except Exception:  # noqa: BLE001 - the loop is going away either way
        logger.exception("could not release the engine's requests")
