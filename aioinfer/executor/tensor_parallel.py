"""The tensor-parallel executor, rank 0 of the group: this process's shard in a ModelRunner, with
every step first sent to the worker processes of ranks 1..N-1.

EngineCore gets this executor instead of the local one when tensor_parallel_size > 1 (factory.py);
the scheduler and everything above it never know. Start-up, in order: resolve the model to a local
path every rank can open; check the split (before any process starts); spawn ranks 1..N-1; join
the rendezvous (tcp://127.0.0.1:<free port>); broadcast the config; open the step channel
(step_channel.py); load this rank's shard and agree on the KV block count (runner_setup.py). Each
step: check the workers are alive, send the SchedulerOutput down the step channel, then run it here.

Async scheduling works as at one rank: the engine may launch step N+1 before it collects step N.
Each message carries how many launched steps rank 0 has not collected yet, and a worker collects
its own oldest steps down to that count before it launches, so every rank launches and collects
in the same order and its per-request state (sampled-token counts, penalty history) matches rank
0's at every launch. A look-ahead step's input tokens are the previous step's sampled ids, still
on the device: each rank uses its own, which are rank 0's, because every rank samples the same
tokens (the hidden states after each all-reduce are the same on every rank, the logits are
gathered whole, and the sampling noise is counter-based). Only rank 0's tokens leave the engine.

Ranks on other machines: set AIOINFER_TP_INIT_METHOD (e.g. ``env://`` with MASTER_ADDR and
MASTER_PORT) and rank 0 spawns nothing; it waits for ranks 1..N-1 started with
``python -m aioinfer.executor.tp_worker`` (docs/distributed.md).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import time
import weakref
from dataclasses import dataclass
from typing import Any, Optional

import torch

from aioinfer.config import EngineConfig
from aioinfer.distributed.group import (
    DEVICE_TIMEOUT_S,
    TPGroup,
    destroy_tp_group,
    init_tp_group,
)
from aioinfer.errors import TensorParallelError, WorkerProcessError
from aioinfer.executor.abstract import Executor
from aioinfer.executor.model_setup import local_model_name, resolve_device
from aioinfer.executor.runner_setup import build_rank_runner, check_shardable, rank_config
from aioinfer.executor.step_channel import GlooStepChannel, StepSender, open_step_sender
from aioinfer.executor.tp_processes import WorkerProcesses
from aioinfer.models.loader import load_arch_config, resolve_model_source

logger = logging.getLogger(__name__)

_LIVENESS_PERIOD_S = 1.0  # while waiting for a step on CUDA, how often to look at the workers
_DEATH_GRACE_S = 5.0  # after a collective broke, how long a dying worker may take to be seen dead


@dataclass(slots=True)
class _Resources:
    """What must be released even if the runner is dropped without ``shutdown`` (weakref.finalize)."""

    workers: WorkerProcesses | None = None
    channel: StepSender | GlooStepChannel | None = None
    group: bool = False  # this process joined a tensor-parallel group
    stopping: bool = False  # the stop sentinel went out: the workers are exiting by themselves


@dataclass(slots=True)
class _Launched:
    inner: Any  # the local ModelRunner's launched step
    done: torch.cuda.Event | None  # recorded after the step's device work; None on CPU


class TensorParallelExecutor(Executor):
    """Rank 0's ModelRunner, each step first sent to the workers; ``shutdown`` stops them.

    Grammar masks are computed at launch (rank 0 sends them to the other ranks in the step), so
    ``defers_masks`` is False; swap preemption is not offered (no host blocks).
    """

    defers_masks = False

    def __init__(self, config: EngineConfig) -> None:
        size = config.parallel.tensor_parallel_size
        config = _with_local_model(config)
        check_shardable(load_arch_config(resolve_model_source(config.model.model)), size)
        external = os.environ.get("AIOINFER_TP_INIT_METHOD")
        # External ranks pick their own devices (LOCAL_RANK); only rank 0's is chosen here.
        devices = _rank_devices(resolve_device(config.device), size if external is None else 1)
        self._resources = _Resources()
        self._closer = weakref.finalize(self, _release, self._resources)
        self._cuda = devices[0].startswith("cuda")
        self._uncollected = 0  # steps launched and not collected yet (the engine collects in launch order)
        try:
            if external is None:
                init_method = f"tcp://127.0.0.1:{_free_port()}"
                self._resources.workers = WorkerProcesses()  # registered first: a failed start still stops them
                self._resources.workers.start(size, init_method, devices)
                self._resources.workers.wait_started(DEVICE_TIMEOUT_S)
            else:
                init_method = external
                logger.info("tensor parallel: waiting for %d worker ranks at %s", size - 1, init_method)
            self.group: TPGroup = init_tp_group(0, size, init_method, torch.device(devices[0]))
            self._resources.group = True
            self.group.broadcast_object(config)
            self._resources.channel = open_step_sender(self.group, init_method, DEVICE_TIMEOUT_S, self._check_workers)
            self.loaded, self.runner = build_rank_runner(rank_config(config, devices[0]), self.group)
        except BaseException as exc:
            failure = self._failure(wait_s=_grace(exc))
            self._closer()
            if failure is not None:
                raise WorkerProcessError(failure) from exc
            raise
        logger.info("tensor parallel: %d ranks on %s; worker pids %s", size, devices,
                    self.worker_pids if external is None else "external")

    @property
    def num_kv_blocks(self) -> int:
        return self.runner.num_kv_blocks

    @property
    def worker_pids(self) -> list[int]:
        workers = self._resources.workers
        return workers.pids if workers is not None else []

    def launch(self, scheduler_output) -> _Launched:
        self._check_workers()
        try:
            self._resources.channel.send((self._uncollected, _for_workers(scheduler_output)))
            inner = self.runner.launch(scheduler_output)
        except Exception as exc:
            self._raise_worker_failure(exc)
            raise
        self._uncollected += 1
        done = None
        if self._cuda:
            done = torch.cuda.Event()
            done.record()
        return _Launched(inner, done)

    def collect(self, launched: _Launched, masks_of: Any = None) -> Any:
        if masks_of is not None:
            raise NotImplementedError("tensor parallelism computes grammar masks at launch (defers_masks is False)")
        self._uncollected -= 1
        if launched.done is not None:
            self._wait(launched.done)
        try:
            return self.runner.collect(launched.inner)
        except Exception as exc:
            self._raise_worker_failure(exc)
            raise

    def grammar_failure(self, grammar: Any) -> Optional[str]:
        return self.runner.grammar_masks.failure(grammar)  # rank 0's masks, in this process

    def shutdown(self) -> None:
        """Send the stop sentinel, join the workers, leave the group. Idempotent."""
        if not self._closer.alive:
            return
        workers = self._resources.workers
        channel = self._resources.channel
        if channel is not None and (workers is None or workers.failure() is None):
            try:
                channel.send(None)
                self._resources.stopping = True
            except Exception:  # noqa: BLE001 - a worker died meanwhile; stopping goes on
                logger.warning("could not send the stop sentinel to the tensor-parallel workers")
        if getattr(self, "runner", None) is not None:
            # Captured graphs hold NCCL kernels: let them go before the communicator does (no device
            # sync: after a worker died mid-step, this rank's last all-reduce never completes).
            self.runner.graphs = None
        self._closer()

    def _wait(self, event: torch.cuda.Event) -> None:
        # Poll rather than block: if a worker died mid-step, this rank's NCCL kernels would wait for
        # it forever, and so would a blocking synchronize.
        next_check = time.monotonic() + _LIVENESS_PERIOD_S
        while not event.query():
            if time.monotonic() > next_check:
                self._check_workers()
                next_check = time.monotonic() + _LIVENESS_PERIOD_S
            time.sleep(0)  # yield the GIL to the event loop's thread

    def _check_workers(self) -> None:
        if self._resources.workers is not None:
            self._resources.workers.check()

    def _failure(self, wait_s: float = 0.0) -> str | None:
        workers = self._resources.workers
        return workers.failure(wait_s) if workers is not None else None

    def _raise_worker_failure(self, exc: BaseException) -> None:
        """A collective failed: if a worker is behind it, say which one and why."""
        failure = self._failure(wait_s=_grace(exc))
        if failure is not None:
            raise WorkerProcessError(failure) from exc


def _for_workers(scheduler_output):
    """The step as the workers get it: a request's matcher stays here (rank 0 sends its masks)."""
    if not any(new.grammar is not None for new in scheduler_output.new_requests):
        return scheduler_output
    from aioinfer.structured_output.grammar_mask import REMOTE_GRAMMAR

    return dataclasses.replace(scheduler_output, new_requests=[
        dataclasses.replace(new, grammar=REMOTE_GRAMMAR) if new.grammar is not None else new
        for new in scheduler_output.new_requests])


def _grace(exc: BaseException) -> float:
    """Seconds to wait for a worker's death to show: only a broken collective or step channel hints at
    one (gloo reports a vanished peer as a plain RuntimeError that names gloo's transport)."""
    import torch.distributed as dist

    broken = isinstance(exc, (dist.DistError, ConnectionError)) or (
        isinstance(exc, RuntimeError) and "gloo" in str(exc))
    return _DEATH_GRACE_S if broken else 0.0


def _release(resources: _Resources) -> None:
    # Workers first: after the stop sentinel they exit by themselves (join); without it (a failure,
    # or the runner dropped unclosed) they are still waiting in a collective, so terminate them.
    # Then this rank's group, whose peers are gone, so its teardown waits for nobody.
    if resources.workers is not None:
        resources.workers.stop(timeout_s=30.0 if resources.stopping else 0.0)
        resources.workers = None
    if resources.channel is not None:
        resources.channel.close()
        resources.channel = None
    if resources.group:
        resources.group = False
        try:
            destroy_tp_group()
        except Exception:
            logger.exception("could not destroy the tensor-parallel process group")


def _with_local_model(config: EngineConfig) -> EngineConfig:
    """The config with ``model`` resolved to a local path (default-model alias, hub download): done
    once here, so that the workers never download anything themselves."""
    name = local_model_name(config.model.model)
    return dataclasses.replace(config, model=dataclasses.replace(config.model, model=name))


def _rank_devices(device: torch.device, size: int) -> list[str]:
    """Rank r's device: consecutive CUDA devices from the configured one, or the CPU for all."""
    if device.type != "cuda":
        return ["cpu"] * size
    first = device.index if device.index is not None else torch.cuda.current_device()
    if first + size > torch.cuda.device_count():
        raise TensorParallelError(f"tensor_parallel_size {size} from cuda:{first} needs {first + size} CUDA "
                                  f"devices, this machine has {torch.cuda.device_count()}")
    return [f"cuda:{first + r}" for r in range(size)]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
