"""The local executor: one ModelRunner in this process, on this engine's device.

The whole model runs here (tensor_parallel_size 1): the executor loads it (or takes one already
loaded, e.g. by a data-parallel replica that shares a tokenizer), builds the runner once
(runner_setup.py sizes the KV cache) and hands every step to it unchanged.
"""

from __future__ import annotations

from typing import Any, Optional

from aioinfer.config import EngineConfig
from aioinfer.core.scheduler_output import RunnerOutput, SchedulerOutput
from aioinfer.executor.abstract import Executor
from aioinfer.executor.model_setup import LoadedModel, load_for_engine
from aioinfer.executor.runner_setup import build_runner


class LocalExecutor(Executor):
    defers_masks = True  # the grammar masks are filled by this process's worker thread, whenever they are ready

    def __init__(self, config: EngineConfig, loaded: LoadedModel | None = None) -> None:
        self.loaded = loaded or load_for_engine(config)
        self.runner = build_runner(config, self.loaded)  # the ModelRunner (also for inspection: tests, benchmarks)

    @property
    def num_kv_blocks(self) -> int:
        return self.runner.num_kv_blocks

    @property
    def num_host_blocks(self) -> int:
        return self.runner.num_host_blocks

    def launch(self, scheduler_output: SchedulerOutput) -> Any:
        return self.runner.launch(scheduler_output)

    def collect(self, launched: Any, masks_of: Any = None) -> RunnerOutput:
        # Without ``masks_of`` the runner is called as plain ``collect(launched)`` (the null runner of
        # benchmarks/null_runner.py replaces ModelRunner's with one of that signature).
        if masks_of is None:
            return self.runner.collect(launched)
        return self.runner.collect(launched, masks_of=masks_of)

    def execute(self, scheduler_output: SchedulerOutput) -> RunnerOutput:
        return self.runner.execute(scheduler_output)

    def prepare(self, scheduler_output: SchedulerOutput) -> Any:
        return self.runner.prepare(scheduler_output)

    def run(self, prepared: Any, defer_masks: bool = False) -> Any:
        return self.runner.run(prepared, defer_masks)

    def finish(self, launched: Any) -> None:
        self.runner.finish(launched)

    def poll_masks(self, launched: Any) -> bool:
        return self.runner.poll_masks(launched)

    def grammar_failure(self, grammar: Any) -> Optional[str]:
        return self.runner.grammar_masks.failure(grammar)

    def take_swap_timings(self) -> tuple:
        return tuple(self.runner.take_swap_timings())

    def shutdown(self) -> None:
        self.runner.shutdown()
