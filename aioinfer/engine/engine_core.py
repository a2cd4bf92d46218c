"""The synchronous engine core: schedule, execute, update. One call of ``step`` is one batch.

Used directly by the offline ``LLM`` and, on its dedicated thread, by the async ``Engine``. The
model runs behind an ``Executor`` (executor/): one ModelRunner here, or a tensor-parallel group.
"""

from __future__ import annotations

import logging
import time

from aioinfer.config import EngineConfig
from aioinfer.core.kv_cache_manager import KVCacheManager
from aioinfer.core.scheduler import Scheduler
from aioinfer.core.scheduler_output import EngineCoreOutput, RunnerOutput, SchedulerOutput
from aioinfer.executor.abstract import Executor
from aioinfer.executor.factory import create_executor
from aioinfer.executor.model_setup import LoadedModel
from aioinfer.request import Request, RequestStatus
from aioinfer.spec_decode.policy import DEFAULT_MAX_STEP_TOKENS
from aioinfer.structured_output.limits import GrammarLimits, describe_error

logger = logging.getLogger(__name__)


class EngineCore:
    def __init__(self, config: EngineConfig, loaded: LoadedModel | None = None, data_parallel_rank: int = 0) -> None:
        self.config = config
        # KV-cache events (kv_events_config): opened first, so that a taken port fails before the model
        # loads; None when off, and then the only cost is the prefix cache's None tests
        self.kv_events_publisher = _kv_events_publisher(config, data_parallel_rank)
        try:
            self.executor: Executor = create_executor(config, loaded)
        except BaseException:
            if self.kv_events_publisher is not None:
                self.kv_events_publisher.shutdown()
            raise
        self.loaded = self.executor.loaded
        self.kv_cache = KVCacheManager(self.executor.num_kv_blocks, config.cache.block_size,
                                       enable_prefix_caching=config.cache.enable_prefix_caching,
                                       model_identity=config.model.model,
                                       kv_events=self.kv_events_publisher is not None)
        # Host blocks for swap preemption (swap_space_gib / bytes per block), sized by the executor;
        # one without swap support has none, and the scheduler then always recomputes.
        num_host_blocks = self.executor.num_host_blocks if config.scheduler.preemption_mode == "swap" else 0
        # vLLM's vllm:cache_config_info labels (metrics.py): the cache as configured and as sized
        self.cache_config_info = config.cache.metrics_info(self.executor.num_kv_blocks, num_host_blocks)
        self.scheduler = Scheduler(config.scheduler, self.kv_cache, self.loaded.max_model_len,
                                   num_host_blocks=num_host_blocks, speculative=config.speculative,
                                   # a step with drafts stays within the largest CUDA-graph token bucket
                                   max_draft_step_tokens=(config.max_cuda_graph_prefill_tokens
                                                          or DEFAULT_MAX_STEP_TOKENS))
        self.num_steps = 0
        # Async scheduling: launch step N+1 before waiting for step N's sampled ids, so that the host
        # work between steps overlaps the device work. The default on CUDA (H200: 0.5b batch-1 decode
        # 1.34 -> 1.12 ms/token, 7b workload 1 +10%); off on CPU, where the device is the host.
        # Tensor parallelism too: the workers launch and collect in rank 0's order (executor/tp_worker.py).
        self.async_scheduling = (self.loaded.device.type == "cuda" if config.async_scheduling is None
                                 else config.async_scheduling)
        self._in_flight = None  # (SchedulerOutput, launched step) not yet collected
        self._deferred = False  # the step in flight was launched with deferred masks, not yet sampled
        self._last_step_end = None  # perf_counter at the end of the last step (speculation's payoff)
        # Added requests that need every token on the host before their next step is scheduled
        # (penalties) and not yet seen finished: usually none, so the per-step schedule-ahead test need
        # not scan every running request (~0.25 us each, every step).
        self._needs_known_tokens: list[Request] = []
        # Added requests with a grammar, not yet seen finished, by id: a step scheduled ahead is launched
        # with its masks deferred until the tokens before it are collected (structured_output/grammar_mask.py),
        # and one that ends is asked whether its grammar could be kept (``_check_grammar_ends``).
        self._grammar_requests: dict[str, Request] = {}
        self._grammar_sweep_at = 64  # _grammar_requests' length past which it is swept anyway
        # What this engine's constraints may cost to compile; its input processor's compiler takes them.
        self.grammar_limits = GrammarLimits(config.structured_outputs_max_bytes,
                                            config.structured_outputs_compile_timeout)

    def shutdown(self) -> None:
        """Release what outlives a step: the runner's threads, the tensor-parallel worker processes, the
        KV-event publisher's sockets. Idempotent."""
        self.executor.shutdown()
        if self.kv_events_publisher is not None:
            self.publish_kv_events()
            self.kv_events_publisher.shutdown()

    def add_request(self, request: Request) -> None:
        self.scheduler.add_request(request)
        if _has_penalties(request.sampling_params):
            self._needs_known_tokens.append(request)
        if request.grammar is not None:
            self._grammar_requests[request.request_id] = request

    def finish_requests(self, request_ids: list[str], status: RequestStatus = RequestStatus.FINISHED_ABORTED) -> list[str]:
        """Abort (or stop) requests; their blocks are free when this returns. Returns the ids that were open."""
        if self._grammar_requests:
            for request_id in request_ids:
                self._grammar_requests.pop(request_id, None)
        finished = [r.request_id for r in self.scheduler.finish_requests(request_ids, status)]
        if self.kv_events_publisher is not None:  # their full blocks were cached as they were freed
            self.publish_kv_events()
        return finished

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block (vLLM's ``reset_prefix_cache``); False, and no change, while a
        request holds blocks. Subscribers of KV-cache events hear ``AllBlocksCleared``."""
        reset = self.kv_cache.reset_prefix_cache()
        if self.kv_events_publisher is not None:
            self.publish_kv_events()
        return reset

    def publish_kv_events(self) -> None:
        """Hand the KV-cache events recorded since the last call to the publisher's thread (called once a
        step, and after aborts and resets, only while a publisher exists)."""
        events = self.kv_cache.events.take()
        if events:
            self.kv_events_publisher.publish(events)

    def take_swap_timings(self) -> tuple:
        """KV swap copies whose timing completed since the last call (``SwapTiming``; empty without swapping)."""
        return self.executor.take_swap_timings()

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished() or self._in_flight is not None

    def step(self) -> list[EngineCoreOutput]:
        return self.step_with_details()[2]

    def step_with_details(self) -> tuple[SchedulerOutput, RunnerOutput, list[EngineCoreOutput]]:
        """One step; also returns what was scheduled and sampled (for stats).

        With async scheduling the step returned is the one launched by the previous call (or now),
        and the next one is already launched before this one's results are waited for.
        """
        lockstep = self._in_flight is None  # scheduled now, every token known (not ahead of the last step)
        if lockstep:
            scheduler_output = self.scheduler.schedule()
            launched = self.executor.launch(scheduler_output)
        else:
            scheduler_output, launched = self._in_flight
            self._in_flight = None
        ahead = None
        if self.async_scheduling and not scheduler_output.is_empty and self._can_schedule_ahead(scheduler_output):
            ahead = self.scheduler.schedule()
            # Swaps alone must reach the runner too: the scheduler has already freed a swapped-out
            # request's device blocks.
            if ahead.is_empty and not ahead.finished_request_ids and not ahead.has_swaps:
                ahead = None
        masks_of = None  # the step ahead, launched with its masks deferred (a grammar runs)
        if ahead is not None and self._grammars_alive():
            # ``launched`` is sampled as soon as its masks are computed, so that the device samples
            # while the host goes on; its inputs are prepared first when the masks are still being
            # filled, which that host work then overlaps.
            if self._deferred and self.executor.poll_masks(launched):
                self._finish_deferred(launched)
            prepared = self.executor.prepare(ahead)
            self._finish_deferred(launched)
            masks_of = self.executor.run(prepared, defer_masks=True)
            self._in_flight, self._deferred = (ahead, masks_of), True
        else:
            self._finish_deferred(launched)
            if ahead is not None:
                self._in_flight = (ahead, self.executor.launch(ahead))
        runner_output = self.executor.collect(launched, masks_of)
        self.num_steps += 1
        if self.async_scheduling and self.scheduler.draft_policy is not None:
            self._time_step(scheduler_output, runner_output, lockstep)
        num_requests = len(self.scheduler.requests)
        outputs = self.scheduler.update(scheduler_output, runner_output)
        if self._grammar_requests and len(self.scheduler.requests) != num_requests:  # some finished
            self._check_grammar_ends(outputs)
        if masks_of is not None and self.executor.poll_masks(masks_of):
            # Computed meanwhile: sampled now, behind its forward, rather than after the next schedule.
            self._finish_deferred(masks_of)
        if self.kv_events_publisher is not None:
            self.publish_kv_events()
        return scheduler_output, runner_output, outputs

    def _finish_deferred(self, launched) -> None:
        """``launched`` went ahead with deferred masks, filling since its predecessor was collected
        (while the engine handled that step and scheduled the next): sampled now, at the latest
        before the next launch, whose placeholder inputs are its sampled ids."""
        if self._deferred:
            self.executor.finish(launched)
            self._deferred = False

    def _grammars_alive(self) -> bool:
        """Whether an added request with a grammar is not finished: every step asks, so the list is
        only swept when its oldest request has finished or finished ones may have piled up behind
        it (a long request ahead of many short ones)."""
        requests = self._grammar_requests
        if requests and not next(iter(requests.values())).status.finished and len(requests) <= self._grammar_sweep_at:
            return True
        self._grammar_requests = requests = {i: r for i, r in requests.items() if not r.status.finished}
        self._grammar_sweep_at = max(64, 2 * len(requests))
        return bool(requests)

    def _check_grammar_ends(self, outputs: list[EngineCoreOutput]) -> None:
        """A constrained request that ended (EOS, a stop, its length) while its matcher was in its error
        state (one of llguidance's limits met mid-output, or a dead end of its grammar: its mask then
        allowed EOS only) did not keep its constraint: it ends with finish_reason "error", the reason
        as its stop_reason, never with a "stop" whose text breaks the schema."""
        for out in outputs:
            if out.finish_reason is None:
                continue
            request = self._grammar_requests.pop(out.request_id, None)
            if request is None or out.finish_reason == "abort":
                continue
            error = self.executor.grammar_failure(request.grammar)
            if error:
                reason = describe_error(error)
                logger.warning("request %s: its structured-output constraint could not be kept: %s",
                               out.request_id, reason)
                request.status = RequestStatus.FINISHED_ERROR
                out.finish_reason = "error"
                out.stop_reason = f"the output could not be kept to its constraint: {reason}"

    def _time_step(self, scheduler_output: SchedulerOutput, runner_output: RunnerOutput, lockstep: bool) -> None:
        """Speculation's measured payoff (spec_decode/payoff.py): a decode step's tokens over the time
        since the step before it ended (the caller's handling of that one included)."""
        now = time.perf_counter()
        num_seqs = len(scheduler_output.scheduled)
        if (self._last_step_end is not None and num_seqs
                and scheduler_output.num_scheduled_tokens == num_seqs + scheduler_output.num_draft_tokens):
            self.scheduler.draft_policy.payoff.observe(num_seqs, lockstep, runner_output.num_tokens,
                                                       now - self._last_step_end)
        self._last_step_end = now

    def drain(self) -> list[EngineCoreOutput]:
        """Wait for the step launched ahead, if any (after aborts: its results are dropped by update)."""
        if self._in_flight is None:
            return []
        scheduler_output, launched = self._in_flight
        self._in_flight = None
        self._finish_deferred(launched)
        outputs = self.scheduler.update(scheduler_output, self.executor.collect(launched))
        if self.kv_events_publisher is not None:
            self.publish_kv_events()
        return outputs

    def _can_schedule_ahead(self, launched: SchedulerOutput) -> bool:
        # Penalties read the content of every generated token, which is still on the device (a
        # grammar's mask too, but only at sampling: see step_with_details). The
        # scheduler's running set is exactly its requests with status RUNNING (check_invariants).
        # One still waiting may be admitted in the step ahead: it has no token in flight then (the
        # scheduler admits none that has), and the step after it is in lockstep.
        lockstep_needed = False
        if not self.executor.defers_masks and self._grammars_alive():
            # Masks computed at launch (tensor parallelism: rank 0 sends them to the other ranks in
            # the step) need every token before them on the host.
            return False
        if self._needs_known_tokens:
            self._needs_known_tokens = [r for r in self._needs_known_tokens if not r.status.finished]
            lockstep_needed = any(r.status == RequestStatus.RUNNING for r in self._needs_known_tokens)
        # Drafts: the next step needs to know how many were accepted, and a request can only draft
        # once its last token is known, so speculation that wants to run keeps the steps in lockstep.
        # The policy decides after every step, one with drafts too (whose successor is in lockstep
        # anyway), whether the next may carry drafts; in a lockstep batch they cost no overlap.
        policy = self.scheduler.draft_policy
        if policy is not None and (policy.wants_known_tokens(self.scheduler.running, lockstep_anyway=lockstep_needed)
                                   or launched.num_draft_tokens):
            return False
        return not lockstep_needed


def _kv_events_publisher(config: EngineConfig, data_parallel_rank: int):
    """The engine's KV-event publisher (engine/kv_events_publisher.py), or None: not asked for, or no
    prefix cache (whose blocks are what the events are about)."""
    if config.kv_events is None or not config.kv_events.publishes:
        return None
    if not config.cache.enable_prefix_caching:
        logger.warning("kv_events_config is set but prefix caching is off: there are no cached blocks to publish")
        return None
    from aioinfer.engine.kv_events_publisher import KVEventPublisher

    return KVEventPublisher(config.kv_events, config.cache.block_size, data_parallel_rank)


def _has_penalties(params) -> bool:
    return (params.repetition_penalty != 1.0 or params.frequency_penalty != 0.0
            or params.presence_penalty != 0.0)
