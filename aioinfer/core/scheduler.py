"""Continuous batching under a token budget (pure Python; never imports torch).

One rule (vLLM v1's): every request's computed tokens catch up with its known tokens. Each step
grants running requests first, in scheduling order, then admits waiting ones while the budget,
the sequence limit and the KV pool allow. A grant smaller than what is left of a prompt is a chunk
of a chunked prefill; a grant that reaches the end of the known tokens samples one token; a
prefix-cache hit is a request admitted with computed tokens already > 0.

Scheduling order is by priority with aging, FCFS within a priority (request_queue.py). When the
pool runs dry, the last running request in that order (lowest priority, latest arrival) is
preempted and goes back to the waiting queue: by recompute (its blocks are dropped; prompt and
output so far are computed again, through the prefix cache where its blocks survived), or, with
``preemption_mode="swap"``, by moving its blocks to a run of host blocks (a SwapOut for the
runner) and later back into fresh device blocks (a SwapIn), after which it simply continues.
A victim whose prompt is not computed yet is always recomputed, and so is any victim when no run
of host blocks is free.

A waiting request that outranks the last running one (a strictly better priority, aging included:
``outranks``) does not wait for memory (vLLM's priority policy): before the running requests are
granted, it is admitted into its place in the order, and if its blocks or a sequence slot are
missing, the fewest running requests it outranks are preempted from the back of the order, or none
when even all of them would not make room. Equal priorities never preempt each other.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable

from aioinfer.config import SchedulerConfig, SpeculativeConfig
from aioinfer.core.draft_grants import grant_drafts, update_verified
from aioinfer.core.host_block_pool import HostBlockPool
from aioinfer.core.kv_cache_manager import KVCacheManager, cdiv
from aioinfer.core.priority_victims import num_victims_for
from aioinfer.core.request_queue import (
    PRIORITY_AGING_STEPS,
    RequestQueue,
    insert_ordered,
    order_key,
    outranks,
)
from aioinfer.core.scheduler_invariants import check_scheduler_invariants
from aioinfer.core.scheduler_output import (
    EngineCoreOutput,
    NewRequestData,
    RunnerOutput,
    ScheduledRequest,
    SchedulerOutput,
    SwapIn,
    SwapOut,
)
from aioinfer.request import Request, RequestStatus
from aioinfer.spec_decode.policy import DEFAULT_MAX_STEP_TOKENS, DraftPolicy

logger = logging.getLogger(__name__)


PLACEHOLDER_TOKEN = -1  # a token id sampled on the device but not yet known on the host
_FIRST_FINISHED = RequestStatus.FINISHED_STOPPED  # statuses from here on are finished (RequestStatus.finished)


class RequestTooLongError(ValueError):
    """A request can never run: it exceeds the context length or the whole KV cache."""


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv_cache: KVCacheManager, max_model_len: int,
                 num_host_blocks: int = 0, priority_aging_steps: int = PRIORITY_AGING_STEPS,
                 speculative: SpeculativeConfig | None = None,
                 max_draft_step_tokens: int = DEFAULT_MAX_STEP_TOKENS) -> None:
        if priority_aging_steps < 1:
            raise ValueError(f"priority_aging_steps must be >= 1, got {priority_aging_steps}")
        self.config = config
        self.kv_cache = kv_cache
        self.max_model_len = max_model_len
        self.priority_aging_steps = priority_aging_steps
        swap = config.preemption_mode == "swap"
        self.host_pool = HostBlockPool(num_host_blocks if swap else 0)
        if swap and num_host_blocks == 0:
            logger.warning("preemption_mode='swap' without host blocks (swap_space_gib or the runner's "
                           "support): every preemption recomputes")
        self.requests: dict[str, Request] = {}
        # Speculative decoding: who drafts, and the totals (None: off).
        self.draft_policy = (DraftPolicy(speculative, max_draft_step_tokens) if speculative is not None
                             else None)
        self.waiting = RequestQueue()  # new, preempted and swapped requests, in scheduling order
        self.running: list[Request] = []  # in scheduling order: the last is the first victim
        self._known_to_runner: set[str] = set()
        self._finished_since_last_step: list[str] = []
        self._num_steps = 0  # schedule() calls: the clock of priority aging
        self._arrivals = itertools.count()
        # Totals, for metrics and tests:
        self.num_preemptions = 0
        self.num_priority_preemptions = 0  # of those, victims of a waiting request that outranked them
        self.num_swapped_out = 0  # preemptions that went to host memory
        self.num_swapped_in = 0
        self.last_prefilled_prompt_tokens = 0  # prompt tokens of requests whose first token the last update saw

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
        if not isinstance(request.priority, int) or isinstance(request.priority, bool):
            raise ValueError(f"priority must be an integer, got {request.priority!r}")
        request.order_key = order_key(request.priority, self._num_steps, next(self._arrivals),
                                      self.priority_aging_steps)
        params = request.sampling_params
        request.length_limit = min(request.max_tokens, self.max_model_len - len(request.prompt_token_ids))
        request.stop_candidates = frozenset(
            (() if params.ignore_eos else request.eos_token_ids) + tuple(params.stop_token_ids or ()))
        self.requests[request.request_id] = request
        self.waiting.push(request)

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
        self._num_steps += 1
        budget = self.config.max_num_batched_tokens
        scheduled: list[ScheduledRequest] = []
        new_requests: list[NewRequestData] = []
        swap_out: list[SwapOut] = []
        swap_in: list[SwapIn] = []

        preemptions_before = self.num_preemptions
        # Before the grants: a victim granted in this step would have to be taken back from the runner.
        queries, hits = self._admit_outranking(swap_out, swap_in)
        num_preempted_for_priority = self.num_preemptions - preemptions_before
        # The decode-heavy hot loop: every running request passes here each step, so the per-request
        # values are computed once, inline (each property or helper call costs ~0.1 us, x256 x2 steps).
        running = self.running
        max_model_len = self.max_model_len
        block_ids, block_size = self.kv_cache.block_ids, self.kv_cache.block_size
        cache_blocks, known_to_runner = self.kv_cache.cache_blocks, self._known_to_runner
        # Drafts only in a batch small enough for them to pay (spec_decode/policy.py).
        policy = self.draft_policy
        if policy is not None:
            policy.begin_step()
            if not policy.active(len(running)):
                policy = None
            else:
                draft_room = policy.step_draft_room(len(running))
        num_drafted = 0
        index = 0
        while index < len(running) and budget > 0:
            request = running[index]
            pending = request.num_pending_tokens
            num_output = len(request.output_token_ids)
            num_tokens = len(request.prompt_token_ids) + num_output
            # Its token in flight is its last (length limit): nothing more to compute.
            if pending and (num_output + pending >= request.max_tokens
                            or num_tokens + pending >= max_model_len):
                index += 1
                continue
            start = request.num_computed_tokens
            num_new = min(num_tokens + pending - start, budget)
            table = block_ids(request.request_id)
            # A decode step needs a new block only every block_size tokens: skip the allocator otherwise.
            if start + num_new > len(table) * block_size:
                if not self._allocate_or_preempt(request, num_new, swap_out):
                    break  # the request itself was the last in order: it went back to waiting
                table = block_ids(request.request_id)
            if num_new == 1 and start == num_tokens + pending - 1 and request.request_id in known_to_runner:
                if policy is not None:
                    # A wait counts every decode grant, the ones with a token in flight too: under async
                    # scheduling most are, and the engine only stops scheduling ahead once a wait is over.
                    if request.draft_wait:
                        request.draft_wait -= 1
                    elif not pending and policy.allow_drafts:
                        granted = grant_drafts(self.kv_cache, request, policy, start, num_tokens,
                                               min(budget, 1 + draft_room - num_drafted))
                        if granted is not None:
                            scheduled.append(granted)
                            num_drafted += granted.num_draft_tokens
                            budget -= 1 + granted.num_draft_tokens
                            index += 1
                            continue
                # A decode step (one token, the last known or the one in flight): ``_grant`` inline.
                request.num_computed_tokens = start + 1
                request.num_pending_tokens = pending + 1
                cache_blocks(request, num_tokens)
                scheduled.append(ScheduledRequest(
                    request.request_id, [PLACEHOLDER_TOKEN] if pending else request.token_ids_slice(start, num_tokens),
                    start, table, True))
            else:
                scheduled.append(self._grant(request, num_new, new_requests, num_tokens, pending, table))
            budget -= num_new
            index += 1
        num_preempted = self.num_preemptions - preemptions_before

        # Admitting while preempting for memory would only thrash: the newcomers would be the next victims.
        if num_preempted == num_preempted_for_priority:
            while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
                request = self.waiting.peek()
                if request.num_pending_tokens:
                    break  # preempted while its last token was in flight: resume once the token is known
                admitted = self._admit(request, swap_in)
                if admitted is None:
                    break  # its uncached blocks do not fit beside the other reservations
                queries += admitted[0]
                hits += admitted[1]
                num_new = min(request.num_tokens - request.num_computed_tokens, budget)
                allocated = self.kv_cache.allocate_slots(request.request_id, request.num_computed_tokens, num_new)
                assert allocated is not None, "admission reserved these blocks"
                scheduled.append(self._grant(request, num_new, new_requests, request.num_tokens, 0,
                                             self.kv_cache.block_ids(request.request_id)))
                budget -= num_new

        finished, self._finished_since_last_step = self._finished_since_last_step, []
        return SchedulerOutput(
            scheduled=scheduled,
            new_requests=new_requests,
            finished_request_ids=finished,
            num_scheduled_tokens=self.config.max_num_batched_tokens - budget,
            num_preempted=num_preempted,
            swap_out=swap_out,
            swap_in=swap_in,
            num_prefix_cache_queries=queries,
            num_prefix_cache_hits=hits,
            num_draft_tokens=num_drafted,
        )

    def _admit(self, request: Request, swap_in: list[SwapIn]) -> tuple[int, int] | None:
        """Move the head of the waiting queue into the running set, its blocks reserved (swapped: its
        swap-in issued). Returns the prefix-cache (queries, hits) in tokens, or None (and no change)
        when it does not fit."""
        queries = hits = 0
        if request.status == RequestStatus.SWAPPED:
            if not self._swap_in(request, swap_in):
                return None
        else:
            num_cached = self._admit_blocks(request)
            if num_cached is None:
                return None
            request.num_computed_tokens = num_cached
            if request.num_cached_tokens is None:  # first admission: what usage reports
                request.num_cached_tokens = min(num_cached, request.num_prompt_tokens)
                queries, hits = request.num_tokens, num_cached
        self.waiting.pop()
        request.status = RequestStatus.RUNNING
        insert_ordered(self.running, request)
        return queries, hits

    def _admit_blocks(self, request: Request) -> int | None:
        """``kv_cache.admit``; a request whose prompt logprobs are not complete takes no cached blocks
        (vLLM's rule too), since a position served from the cache has no logits. Its own blocks are
        cached as usual for others. Once its first token is out, the prompt's rows are all in, and a
        recompute after preemption may use the cache again."""
        return self.kv_cache.admit(request, match=not request.needs_prompt_logits)

    def _admit_outranking(self, swap_out: list[SwapOut], swap_in: list[SwapIn]) -> tuple[int, int]:
        """Admit waiting requests that outrank the last running one, preempting what they outrank.

        Only the head can outrank anyone (it has the smallest key), and only a new arrival can be such
        a head: a request that ran before was preempted after everything behind it, and the queue
        admits in order. It joins the running set here, before the grants, so that it is granted in its
        place in the order (ahead of the requests it outranks) and so that no victim has a grant in this
        step. Returns the prefix-cache (queries, hits) in tokens.
        """
        queries = hits = 0
        while self.waiting and self.running:
            request = self.waiting.peek()
            # Never a swapped request, which cannot happen anyway: preempted again in this step's
            # grants, its swap-out would be copied before its own swap-in (the runner's order).
            if (request.num_pending_tokens or request.status == RequestStatus.SWAPPED
                    or not outranks(request, self.running[-1])):
                break
            num_victims = num_victims_for(request, self.running, self.kv_cache, self.config.max_num_seqs)
            if num_victims is None:
                break  # even every request it outranks would not make room: wait, preempting none
            for _ in range(num_victims):
                self._preempt(self.running.pop(), swap_out)
                self.num_priority_preemptions += 1
            admitted = self._admit(request, swap_in)
            if admitted is None:
                # Only a prefix-cache hash collision evicting one of its hits while the victims' blocks
                # were cached can get here; it waits at the head like any request that does not fit.
                break
            queries += admitted[0]
            hits += admitted[1]
        return queries, hits

    def _allocate_or_preempt(self, request: Request, num_new: int, swap_out: list[SwapOut]) -> bool:
        """Allocate blocks for ``request``, preempting running requests from the back of the order.

        Returns False when ``request`` itself had to be preempted (it was the last left).
        """
        while self.kv_cache.allocate_slots(request.request_id, request.num_computed_tokens, num_new) is None:
            victim = self.running.pop()
            self._preempt(victim, swap_out)
            if victim is request:
                return False
        return True

    def _preempt(self, request: Request, swap_out: list[SwapOut]) -> None:
        table = self.kv_cache.block_ids(request.request_id)
        host_start = None
        # Only a request whose prompt is computed is worth swapping; before that (nothing computed,
        # or a prefill chunk in progress) it is simply un-admitted, and its computed full blocks stay
        # in the prefix cache for its return.
        if (self.host_pool.num_blocks and table
                and request.num_computed_tokens >= request.num_prompt_tokens):
            host_start = self.host_pool.allocate(len(table))
        if host_start is not None:
            # Freed device blocks may be reused by this very step: the runner copies them out before
            # the step's forward writes any KV. Shared (prefix-cached) blocks just lose a reference.
            swap_out.append(SwapOut(request.request_id, tuple(table), host_start))
        self.kv_cache.free(request)
        request.num_preemptions += 1
        self.num_preemptions += 1
        if host_start is not None:
            request.status = RequestStatus.SWAPPED
            request.host_run_start = host_start  # num_computed_tokens stays: its KV is on the host
            self.num_swapped_out += 1
        else:
            request.status = RequestStatus.PREEMPTED
            request.num_computed_tokens = 0
        self.waiting.push(request)

    def _swap_in(self, request: Request, swap_in: list[SwapIn]) -> bool:
        """Reserve and allocate fresh device blocks for a swapped request and emit its SwapIn."""
        start = request.host_run_start
        blocks = self.kv_cache.admit_swapped(request, self.host_pool.run_length(start))
        if blocks is None:
            return False
        # The host run is free for later swap-outs once this copy has been issued: the runner
        # executes every step's copies in order.
        swap_in.append(SwapIn(request.request_id, start, tuple(blocks)))
        self.host_pool.free(start)
        request.host_run_start = None
        self.num_swapped_in += 1
        return True

    def _grant(self, request: Request, num_new: int, new_requests: list[NewRequestData], num_tokens: int,
               num_pending: int, table: list[int]) -> ScheduledRequest:
        """Grant ``num_new`` tokens; ``num_tokens``, ``num_pending`` and the block ``table`` (allocated for
        the grant already) are the request's, passed in because the callers have them at hand."""
        request_id = request.request_id
        start = request.num_computed_tokens
        if request_id not in self._known_to_runner:
            self._known_to_runner.add(request_id)
            new_requests.append(NewRequestData(
                request_id=request_id,
                prompt_token_ids=request.prompt_token_ids,
                sampling_params=request.sampling_params,
                seed=request.seed,
                eos_token_ids=request.eos_token_ids,
                grammar=request.grammar,
            ))
        end = start + num_new
        # Positions past the known tokens hold the token still in flight: PLACEHOLDER_TOKEN, which
        # the runner replaces on the device with the previous step's sampled id.
        if end <= num_tokens:
            known_end = end
            token_ids = request.token_ids_slice(start, end)
        else:
            known_end = num_tokens
            token_ids = [PLACEHOLDER_TOKEN] * (end - num_tokens)
            if start < num_tokens:
                token_ids = request.token_ids_slice(start, num_tokens) + token_ids
        samples = end == num_tokens + num_pending
        # Computed tokens advance when the grant is made (vLLM v1), so that the next step can be
        # scheduled before this one's results are back; a sampling grant leaves a token pending.
        request.num_computed_tokens = end
        if samples:
            request.num_pending_tokens = num_pending + 1
        # Full blocks with known tokens are cacheable now: a request hitting them is scheduled in this
        # step or later, and each layer writes the step's KV before any attention reads it.
        self.kv_cache.cache_blocks(request, known_end)
        return ScheduledRequest(request_id, token_ids, start, table, samples)

    def update(self, scheduler_output: SchedulerOutput, runner_output: RunnerOutput) -> list[EngineCoreOutput]:
        """Append sampled tokens, finish what stopped; return per-request news."""
        outputs: list[EngineCoreOutput] = []
        prefilled_prompt_tokens = 0
        logprob_rows = runner_output.logprobs
        if runner_output.prompt_logprobs:  # before the tokens: a prompt's last rows come with its first token
            self._keep_prompt_logprobs(runner_output.prompt_logprobs)
        # Once per step, not per token: the loop runs for every sampling request.
        get_request = self.requests.get
        stop_status = self._stop_status
        no_logprobs: list = []  # shared by every token without logprobs (read-only downstream)
        for row, (request_id, token_id) in enumerate(
                zip(runner_output.sampled_request_ids, runner_output.sampled_token_ids)):
            request = get_request(request_id)
            # Finished requests leave ``requests``; the status test is a guard, an int comparison.
            if request is None or request.status >= _FIRST_FINISHED:
                continue  # aborted (or finished by an earlier token) while the step ran
            request.num_pending_tokens -= 1
            if request.num_draft_tokens:
                if not request.output_token_ids:  # its first token, drafts after it: the prompt is done
                    prefilled_prompt_tokens += len(request.prompt_token_ids)
                outputs.append(update_verified(self, request, row, token_id, runner_output))
                continue
            output_ids = request.output_token_ids
            output_ids.append(token_id)
            num_output = len(output_ids)
            prompt_rows = None
            if num_output == 1:  # its first token: the prompt is done (vLLM counts it now, once)
                prefilled_prompt_tokens += len(request.prompt_token_ids)
                prompt_rows, request.prompt_logprob_rows = request.prompt_logprob_rows, None
            finish_reason = None
            # The full stop test only where a stop is possible: a stop token, or the length limit.
            if num_output >= request.length_limit or token_id in request.stop_candidates:
                status = stop_status(request, token_id)
                if status is not None:
                    # Preempted while this token was in flight, a request waits; otherwise it runs.
                    (self.running if request.status == RequestStatus.RUNNING else self.waiting).remove(request)
                    self._finish(request, status)
                    finish_reason = request.finish_reason
            logprobs = logprob_rows[row] if logprob_rows else None
            # Positional: keyword arguments would double the constructor's cost (~0.25 us a token).
            outputs.append(EngineCoreOutput(
                request_id, [token_id], no_logprobs if logprobs is None else [logprobs], finish_reason,
                request.stop_reason, len(request.prompt_token_ids), request.num_preemptions,
                request.num_cached_tokens or 0, prompt_rows))
        self.last_prefilled_prompt_tokens = prefilled_prompt_tokens
        return outputs

    def _keep_prompt_logprobs(self, runs: list) -> None:
        """Prompt logprob rows of a step, kept on their requests until the first token takes them out.
        A request preempted meanwhile keeps them (the runner computes no position twice); an ended
        one drops them."""
        for rows in runs:
            request = self.requests.get(rows.request_id)
            if request is None or request.status.finished:
                continue
            if request.prompt_logprob_rows is None:
                request.prompt_logprob_rows = []
            request.prompt_logprob_rows.append(rows)

    def _stop_status(self, request: Request, token_id: int) -> RequestStatus | None:
        params = request.sampling_params
        num_output = len(request.output_token_ids)
        # A stop token counts from the (min_tokens + 1)-th token on; the sampler masks it before that.
        if num_output > params.min_tokens:
            if not params.ignore_eos and token_id in request.eos_token_ids:
                return RequestStatus.FINISHED_STOPPED
            if params.stop_token_ids and token_id in params.stop_token_ids:
                request.stop_reason = token_id
                return RequestStatus.FINISHED_STOPPED
        if (num_output >= request.max_tokens
                or len(request.prompt_token_ids) + num_output >= self.max_model_len):
            return RequestStatus.FINISHED_LENGTH
        return None

    def _finish(self, request: Request, status: RequestStatus) -> None:
        if request.status == RequestStatus.SWAPPED:
            self.host_pool.free(request.host_run_start)
            request.host_run_start = None
        request.status = status
        self.kv_cache.free(request)
        del self.requests[request.request_id]
        if request.request_id in self._known_to_runner:
            self._known_to_runner.discard(request.request_id)
            self._finished_since_last_step.append(request.request_id)

    def check_invariants(self) -> None:
        """Bookkeeping checks for tests: queues, statuses, block tables, reservations, host runs."""
        check_scheduler_invariants(self)
