"""Speculative decoding in the scheduler: a decode grant with drafts, and the bookkeeping after
their verification (core/scheduler.py calls both; spec_decode/ decides who drafts what)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aioinfer.core.kv_cache_manager import KVCacheManager
from aioinfer.core.scheduler_output import EngineCoreOutput, RunnerOutput, ScheduledRequest
from aioinfer.request import Request, RequestStatus
from aioinfer.spec_decode.policy import DraftPolicy

if TYPE_CHECKING:
    from aioinfer.core.scheduler import Scheduler


def grant_drafts(kv_cache: KVCacheManager, request: Request, policy: DraftPolicy, start: int, num_tokens: int,
                 budget: int) -> ScheduledRequest | None:
    """A decode grant with draft tokens after the last known one (its slot already allocated), or
    None when there are no drafts or no free blocks for them: drafts never preempt anyone."""
    drafts = policy.drafts_for(request, budget)
    if not drafts:
        return None
    num_new = 1 + len(drafts)
    if kv_cache.allocate_slots(request.request_id, start, num_new) is None:
        return None
    request.num_computed_tokens = start + num_new  # rolled back by the rejected drafts in update
    request.num_pending_tokens = 1
    request.num_draft_tokens = len(drafts)
    # Only known (committed) tokens enter the prefix cache: never a block holding drafts.
    kv_cache.cache_blocks(request, num_tokens)
    return ScheduledRequest(request.request_id, request.token_ids_slice(start, num_tokens) + drafts, start,
                            kv_cache.block_ids(request.request_id), True, len(drafts))


def update_verified(scheduler: "Scheduler", request: Request, row: int, token_id: int,
                    runner_output: RunnerOutput) -> EngineCoreOutput:
    """A request whose drafts were verified this step (its ``row`` of the runner's output): its
    first sampled token and the tokens accepted after it. Rolls the computed tokens back by the
    rejected drafts (their KV slots are simply overwritten later; whole blocks past the last
    computed token are freed), then appends the tokens up to the first that ends the request."""
    accepted = runner_output.accepted_token_ids
    token_ids = [token_id, *(accepted.get(row, ()) if accepted else ())]
    logprobs: list = []
    if runner_output.logprobs and runner_output.logprobs[row] is not None:
        more = runner_output.accepted_logprobs
        logprobs = [runner_output.logprobs[row], *(more.get(row, ()) if more else ())]
    num_drafts, request.num_draft_tokens = request.num_draft_tokens, 0
    num_accepted = len(token_ids) - 1
    prompt_rows = None
    if not request.output_token_ids:  # drafts on the prompt's last chunk: its rows go with the first token
        prompt_rows, request.prompt_logprob_rows = request.prompt_logprob_rows, None
    if request.status == RequestStatus.RUNNING:  # (a preempted request's computed tokens restart anyway)
        request.num_computed_tokens -= num_drafts - num_accepted
        scheduler.kv_cache.trim(request.request_id, request.num_computed_tokens)
    scheduler.draft_policy.verified(request, num_drafts, num_accepted)
    new_tokens: list[int] = []
    finish_reason = None
    for token_id in token_ids:
        request.output_token_ids.append(token_id)
        new_tokens.append(token_id)
        if len(request.output_token_ids) >= request.length_limit or token_id in request.stop_candidates:
            status = scheduler._stop_status(request, token_id)
            if status is not None:  # the tokens after a stop are dropped
                (scheduler.running if request.status == RequestStatus.RUNNING else scheduler.waiting).remove(request)
                scheduler._finish(request, status)
                finish_reason = request.finish_reason
                break
    return EngineCoreOutput(request.request_id, new_tokens, logprobs[:len(new_tokens)], finish_reason,
                            request.stop_reason, len(request.prompt_token_ids), request.num_preemptions,
                            request.num_cached_tokens or 0, prompt_rows)
