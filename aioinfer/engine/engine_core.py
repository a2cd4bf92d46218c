"""The synchronous engine core: schedule, execute, update. One call of ``step`` is one batch.

Used directly by the offline ``LLM`` and, on its dedicated thread, by the async ``Engine``.
"""

from __future__ import annotations

import logging

from aioinfer.config import EngineConfig
from aioinfer.core.kv_cache_manager import KVCacheManager
from aioinfer.core.scheduler import Scheduler
from aioinfer.core.scheduler_output import EngineCoreOutput, RunnerOutput, SchedulerOutput
from aioinfer.engine.model_setup import LoadedModel, load_for_engine
from aioinfer.request import Request, RequestStatus
from aioinfer.worker.model_runner import ModelRunner

logger = logging.getLogger(__name__)


class EngineCore:
    def __init__(self, config: EngineConfig, loaded: LoadedModel | None = None) -> None:
        self.config = config
        self.loaded = loaded or load_for_engine(config)
        self.runner = ModelRunner(config, self.loaded.model, self.loaded.arch, self.loaded.device,
                                  self.loaded.dtype, self.loaded.max_model_len)
        self.kv_cache = KVCacheManager(self.runner.num_kv_blocks, config.cache.block_size)
        self.scheduler = Scheduler(config.scheduler, self.kv_cache, self.loaded.max_model_len)
        self.num_steps = 0

    def add_request(self, request: Request) -> None:
        self.scheduler.add_request(request)

    def finish_requests(self, request_ids: list[str], status: RequestStatus = RequestStatus.FINISHED_ABORTED) -> list[str]:
        """Abort (or stop) requests; their blocks are free when this returns. Returns the ids that were open."""
        return [r.request_id for r in self.scheduler.finish_requests(request_ids, status)]

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self) -> list[EngineCoreOutput]:
        return self.step_with_details()[2]

    def step_with_details(self) -> tuple[SchedulerOutput, RunnerOutput, list[EngineCoreOutput]]:
        """One step; also returns what was scheduled and sampled (for stats)."""
        scheduler_output = self.scheduler.schedule()
        runner_output = self.runner.execute(scheduler_output)
        self.num_steps += 1
        return scheduler_output, runner_output, self.scheduler.update(scheduler_output, runner_output)
