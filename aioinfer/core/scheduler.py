"""Continuous batching under a token budget (pure Python; never imports torch).

One rule (vLLM v1's): every request's computed tokens catch up with its known tokens. Each step
grants running requests first, oldest first, then admits waiting ones while the budget, the
sequence limit and the KV pool allow. A grant smaller than what is left of a prompt is a chunk
of a chunked prefill; a grant that reaches the end of the known tokens samples one token. When
the pool runs dry, the newest running request is preempted: its blocks are dropped and it goes
back to the front of the waiting queue, to be recomputed from its prompt and output so far.
"""

from __future__ import annotations

from collections import deque
from typing import Iterable, Optional

from aioinfer.config import SchedulerConfig
from aioinfer.core.kv_cache_manager import KVCacheManager, cdiv
from aioinfer.core.scheduler_output import (
    EngineCoreOutput,
    NewRequestData,
    RunnerOutput,
    ScheduledRequest,
    SchedulerOutput,
)
from aioinfer.request import Request, RequestStatus


PLACEHOLDER_TOKEN = -1  # a token id sampled on the device but not yet known on the host


class RequestTooLongError(ValueError):
    """A request can never run: it exceeds the context length or the whole KV cache."""


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv_cache: KVCacheManager, max_model_len: int) -> None:
        self.config = config
        self.kv_cache = kv_cache
        self.max_model_len = max_model_len
        self.requests: dict[str, Request] = {}
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # admission order: the newest is last
        self._known_to_runner: set[str] = set()
        self._finished_since_last_step: list[str] = []
        self.num_preemptions = 0  # total, for metrics and tests

    # ----------------------------------------------------------------- admission

    def check_fits(self, num_prompt_tokens: int, max_tokens: int) -> None:
        """Raise RequestTooLongError when a request could never be scheduled."""
        total = num_prompt_tokens + max_tokens
        if total > self.max_model_len:
            raise RequestTooLongError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                f"{total} tokens ({num_prompt_tokens} in the prompt, {max_tokens} for the completion). "
                f"Please reduce the length of the prompt or of max_tokens.")
        if total > self.kv_cache.capacity_tokens:
            raise RequestTooLongError(
                f"The request needs {total} tokens of KV cache ({num_prompt_tokens} prompt + {max_tokens} "
                f"max_tokens, {cdiv(total, self.kv_cache.block_size)} blocks) but the whole cache holds "
                f"{self.kv_cache.capacity_tokens} tokens. Please reduce max_tokens or the prompt.")

    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already in use")
        if not request.prompt_token_ids:
            raise ValueError("the prompt must contain at least one token")
        self.check_fits(request.num_prompt_tokens, request.max_tokens)
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def finish_requests(self, request_ids: Iterable[str], status: RequestStatus) -> list[Request]:
        """End requests from outside the step (aborts, stop strings); unknown or finished ids are ignored."""
        ended = []
        for request_id in request_ids:
            request = self.requests.get(request_id)
            if request is None or request.status.finished:
                continue
            if request.status == RequestStatus.RUNNING:
                self.running.remove(request)
            else:
                self.waiting.remove(request)
            self._finish(request, status)
            ended.append(request)
        return ended

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # ----------------------------------------------------------------- one step

    def schedule(self) -> SchedulerOutput:
        budget = self.config.max_num_batched_tokens
        scheduled: list[ScheduledRequest] = []
        new_requests: list[NewRequestData] = []

        preemptions_before = self.num_preemptions
        index = 0
        while index < len(self.running) and budget > 0:
            request = self.running[index]
            if request.num_pending_tokens and self._awaits_last_token(request):
                index += 1  # its token in flight is its last (length limit): nothing more to compute
                continue
            num_new = min(self._num_known_or_pending(request) - request.num_computed_tokens, budget)
            if not self._allocate_or_preempt(request, num_new):
                break  # the request itself was the newest left: it went back to waiting
            scheduled.append(self._grant(request, num_new, new_requests))
            budget -= num_new
            index += 1
        num_preempted = self.num_preemptions - preemptions_before

        # Admitting while preempting would only thrash: the newcomers would be the next victims.
        if num_preempted == 0:
            while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
                request = self.waiting[0]
                if request.num_pending_tokens:
                    break  # preempted while its last token was in flight: recompute once the token is known
                num_new = min(request.num_tokens - request.num_computed_tokens, budget)
                if self.kv_cache.allocate_slots(request.request_id, request.num_computed_tokens, num_new) is None:
                    break
                self.waiting.popleft()
                request.status = RequestStatus.RUNNING
                self.running.append(request)
                scheduled.append(self._grant(request, num_new, new_requests))
                budget -= num_new

        finished, self._finished_since_last_step = self._finished_since_last_step, []
        return SchedulerOutput(
            scheduled=scheduled,
            new_requests=new_requests,
            finished_request_ids=finished,
            num_scheduled_tokens=self.config.max_num_batched_tokens - budget,
            num_preempted=num_preempted,
        )

    def _allocate_or_preempt(self, request: Request, num_new: int) -> bool:
        """Allocate blocks for ``request``, preempting the newest running requests as needed.

        Returns False when ``request`` itself had to be preempted (it was the newest left).
        """
        while self.kv_cache.allocate_slots(request.request_id, request.num_computed_tokens, num_new) is None:
            victim = self.running.pop()
            self._preempt(victim)
            if victim is request:
                return False
        return True

    def _preempt(self, request: Request) -> None:
        self.kv_cache.free(request.request_id)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)

    @staticmethod
    def _num_known_or_pending(request: Request) -> int:
        return request.num_tokens + request.num_pending_tokens

    def _awaits_last_token(self, request: Request) -> bool:
        """The token in flight will end the request by length, so it needs no further step."""
        generated = request.num_output_tokens + request.num_pending_tokens
        return generated >= request.max_tokens or self._num_known_or_pending(request) >= self.max_model_len

    def _grant(self, request: Request, num_new: int, new_requests: list[NewRequestData]) -> ScheduledRequest:
        start = request.num_computed_tokens
        if request.request_id not in self._known_to_runner:
            self._known_to_runner.add(request.request_id)
            new_requests.append(NewRequestData(
                request_id=request.request_id,
                prompt_token_ids=request.prompt_token_ids,
                sampling_params=request.sampling_params,
                seed=request.seed,
                eos_token_ids=request.eos_token_ids,
            ))
        end = start + num_new
        known_end = min(end, request.num_tokens)
        # Positions past the known tokens hold the token still in flight: PLACEHOLDER_TOKEN, which
        # the runner replaces on the device with the previous step's sampled id.
        token_ids = request.token_ids_slice(start, known_end) + [PLACEHOLDER_TOKEN] * (end - known_end)
        samples = end == self._num_known_or_pending(request)
        # Computed tokens advance when the grant is made (vLLM v1), so that the next step can be
        # scheduled before this one's results are back; a sampling grant leaves a token pending.
        request.num_computed_tokens = end
        if samples:
            request.num_pending_tokens += 1
        return ScheduledRequest(
            request_id=request.request_id,
            token_ids=token_ids,
            start_position=start,
            block_ids=self.kv_cache.block_ids(request.request_id),
            samples=samples,
        )

    def update(self, scheduler_output: SchedulerOutput, runner_output: RunnerOutput) -> list[EngineCoreOutput]:
        """Append sampled tokens, finish what stopped; return per-request news."""
        outputs: list[EngineCoreOutput] = []
        has_logprobs = bool(runner_output.logprobs)
        for row, (request_id, token_id) in enumerate(
                zip(runner_output.sampled_request_ids, runner_output.sampled_token_ids)):
            request = self.requests.get(request_id)
            if request is None or request.status.finished:
                continue  # aborted (or finished by an earlier token) while the step ran
            request.num_pending_tokens -= 1
            request.output_token_ids.append(token_id)
            status = self._stop_status(request, token_id)
            if status is not None:
                # Preempted while this token was in flight, a request waits; otherwise it runs.
                (self.running if request.status == RequestStatus.RUNNING else self.waiting).remove(request)
                self._finish(request, status)
            logprobs = runner_output.logprobs[row] if has_logprobs else None
            outputs.append(EngineCoreOutput(
                request_id=request_id,
                new_token_ids=[token_id],
                new_logprobs=[logprobs] if logprobs is not None else [],
                finish_reason=request.finish_reason,
                stop_reason=request.stop_reason,
                num_prompt_tokens=request.num_prompt_tokens,
                num_preemptions=request.num_preemptions,
            ))
        return outputs

    def _stop_status(self, request: Request, token_id: int) -> Optional[RequestStatus]:
        params = request.sampling_params
        # A stop token counts from the (min_tokens + 1)-th token on; the sampler masks it before that.
        if request.num_output_tokens > params.min_tokens:
            if not params.ignore_eos and token_id in request.eos_token_ids:
                return RequestStatus.FINISHED_STOPPED
            if token_id in params.stop_token_ids:
                request.stop_reason = token_id
                return RequestStatus.FINISHED_STOPPED
        if request.num_output_tokens >= request.max_tokens or request.num_tokens >= self.max_model_len:
            return RequestStatus.FINISHED_LENGTH
        return None

    def _finish(self, request: Request, status: RequestStatus) -> None:
        request.status = status
        self.kv_cache.free(request.request_id)
        del self.requests[request.request_id]
        if request.request_id in self._known_to_runner:
            self._known_to_runner.discard(request.request_id)
            self._finished_since_last_step.append(request.request_id)

    def check_invariants(self) -> None:
        """Bookkeeping checks for tests: queues, statuses and block tables agree."""
        self.kv_cache.check_invariants()
        assert len(self.running) <= self.config.max_num_seqs
        ids = [r.request_id for r in self.running] + [r.request_id for r in self.waiting]
        assert len(ids) == len(set(ids)) == len(self.requests), "a request is queued twice or lost"
        for request in self.running:
            assert request.status == RequestStatus.RUNNING
        for request in self.waiting:
            assert request.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED)
            assert not self.kv_cache.block_ids(request.request_id), "a waiting request holds blocks"
