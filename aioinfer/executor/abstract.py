"""The Executor interface: what EngineCore drives, whatever runs the model underneath.

Why a layer of its own: the engine schedules in pure Python and hands each step to "the model";
whether that is one ModelRunner in this process (local.py) or rank 0 of a tensor-parallel group
whose other ranks replay every step in their own processes (tensor_parallel.py) is set-up, process
and channel work that the engine should not know about. The engine asks only what is below: the
loaded model's limits, the KV block counts the scheduler hands out, and one step at a time
(vLLM v1's ``Executor`` between ``EngineCore`` and its workers plays the same part).

A step is ``launch`` (enqueue its device work, no host sync) then ``collect`` (wait for its
sampled ids); the engine may launch step N+1 before it collects step N (async scheduling) and
always collects in launch order. ``defers_masks`` says whether a step scheduled ahead may also be
launched with its grammar masks deferred (``prepare`` / ``run`` / ``finish`` / ``poll_masks``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Optional

from aioinfer.core.scheduler_output import RunnerOutput, SchedulerOutput
from aioinfer.executor.model_setup import LoadedModel


class Executor(ABC):
    """One engine's model, KV cache and step execution, behind the calls EngineCore makes."""

    loaded: LoadedModel  # tokenizer, EOS ids, limits, device and dtype of this process's model (rank 0's shard)
    # Whether a step scheduled ahead may be launched with its grammar masks deferred (``run(...,
    # defer_masks=True)``, then ``finish``). False: masks are computed at launch, so a step with a live
    # grammar needs every token before it on the host, and the engine keeps such steps in lockstep.
    defers_masks: bool = False

    @property
    @abstractmethod
    def num_kv_blocks(self) -> int:
        """Device KV blocks the scheduler may hand out (every rank owns this many)."""

    @property
    def num_host_blocks(self) -> int:
        """Host blocks for swap preemption (0: none, the scheduler then always recomputes)."""
        return 0

    @abstractmethod
    def launch(self, scheduler_output: SchedulerOutput) -> Any:
        """Enqueue one step's device work without waiting for it; the handle goes to ``collect``."""

    @abstractmethod
    def collect(self, launched: Any, masks_of: Any = None) -> RunnerOutput:
        """Wait for a launched step's sampled ids. ``masks_of`` (``defers_masks`` only): the step launched
        after it with deferred masks, whose masks start filling once this step's tokens are known."""

    def execute(self, scheduler_output: SchedulerOutput) -> RunnerOutput:
        """Run one step and wait for it (the synchronous path)."""
        return self.collect(self.launch(scheduler_output))

    # The deferred-mask path (``defers_masks``): a step ahead whose masks wait for its predecessor's tokens.
    def prepare(self, scheduler_output: SchedulerOutput) -> Any:
        """A step's host work and input copies, enqueued, but not its forward (``run``)."""
        raise NotImplementedError(f"{type(self).__name__} does not defer grammar masks")

    def run(self, prepared: Any, defer_masks: bool = False) -> Any:
        """Enqueue a prepared step's forward (and its sampling unless ``defer_masks``)."""
        raise NotImplementedError(f"{type(self).__name__} does not defer grammar masks")

    def finish(self, launched: Any) -> None:
        """Sample a step launched with deferred masks, once they are computed."""
        raise NotImplementedError(f"{type(self).__name__} does not defer grammar masks")

    def poll_masks(self, launched: Any) -> bool:
        """Whether a step's deferred masks are computed (``finish`` would not wait for them)."""
        raise NotImplementedError(f"{type(self).__name__} does not defer grammar masks")

    @abstractmethod
    def grammar_failure(self, grammar: Any) -> Optional[str]:
        """The error a request's grammar matcher met (a limit, a dead end), or None if it kept its constraint."""

    def take_swap_timings(self) -> tuple:
        """KV swap copies whose timing completed since the last call (``SwapTiming``; empty without swapping)."""
        return ()

    @abstractmethod
    def shutdown(self) -> None:
        """Release what outlives a step (threads, worker processes, process groups). Idempotent."""
