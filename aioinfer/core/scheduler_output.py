"""What the scheduler hands the model runner each step, and what comes back (plain Python data)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from aioinfer.sampling_params import SamplingParams


@dataclass(slots=True)
class NewRequestData:
    """Sent the first time the runner sees a request; the runner keeps it until the request finishes."""

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    seed: int  # effective sampling seed
    eos_token_ids: tuple[int, ...]
    grammar: Optional[object] = None  # structured outputs: the request's matcher (Request.grammar)


@dataclass(slots=True)
class ScheduledRequest:
    # Built positionally once per request per step (scheduler._grant): keep the field order.
    request_id: str
    token_ids: list[int]  # the tokens whose KV this step computes, in order
    start_position: int  # position of token_ids[0] (= computed tokens before this step)
    block_ids: list[int]  # the request's whole block table after this step's allocation
    samples: bool  # the grant reaches the end of the known tokens: sample the next one
    num_draft_tokens: int = 0  # the last this many of token_ids are drafts to verify (speculative decoding)


@dataclass(frozen=True, slots=True)
class SwapOut:
    """Copy a preempted request's KV blocks to host memory (done by the runner before this step's forward).

    The host blocks are one contiguous run ``host_start .. host_start + len(device_block_ids)`` so that
    the whole swap is one device-to-host copy. The device blocks are free again once the step's
    forward runs: the runner orders the copy before any KV write of the step.
    """

    request_id: str
    device_block_ids: tuple[int, ...]  # the victim's block table, in order
    host_start: int  # first host block of the contiguous run


@dataclass(frozen=True, slots=True)
class SwapIn:
    """Copy a swapped request's KV back from host memory into freshly allocated device blocks (before the forward)."""

    request_id: str
    host_start: int
    device_block_ids: tuple[int, ...]  # the new block table, in order (same length as the host run)


@dataclass(frozen=True, slots=True)
class SwapTiming:
    """One KV swap copy (host <-> device) whose timing events have completed: the runner reports it,
    the engine's statistics carry it to observers."""

    direction: str  # "out" (device -> host) | "in" (host -> device)
    num_blocks: int  # KV blocks moved (all layers of each)
    num_bytes: int  # bytes moved by the one copy
    seconds: float  # the copy alone, timed on its stream (gather / scatter excluded)

    @property
    def gb_per_s(self) -> float:
        return self.num_bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0


@dataclass(slots=True)
class SchedulerOutput:
    scheduled: list[ScheduledRequest]
    new_requests: list[NewRequestData]
    finished_request_ids: list[str]  # finished since the last step: the runner drops their state
    num_scheduled_tokens: int
    num_preempted: int = 0
    swap_out: list[SwapOut] = field(default_factory=list)  # executed first, in order
    swap_in: list[SwapIn] = field(default_factory=list)  # executed after swap_out, before the forward
    num_prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache by this step's admissions
    num_prefix_cache_hits: int = 0  # of those, tokens found cached
    num_draft_tokens: int = 0  # draft tokens granted in this step (speculative decoding): no step goes ahead of it

    @property
    def is_empty(self) -> bool:
        """Nothing for the model to compute (swaps may still be pending: see ``has_swaps``)."""
        return not self.scheduled

    @property
    def has_swaps(self) -> bool:
        return bool(self.swap_out or self.swap_in)


@dataclass(slots=True)
class TokenLogprobs:
    """Log-probabilities for one sampled token, from the raw model logits."""

    sampled_logprob: float
    sampled_rank: int  # 1 = the most likely token
    top_token_ids: list[int]  # the top-N, most likely first
    top_logprobs: list[float]


@dataclass(slots=True)
class PromptLogprobRows:
    """Log-probabilities of a run of consecutive prompt tokens, each given the tokens before it (raw logits).

    Row i scores prompt token ``first_position + i``, from the logits at the position before it. A
    prompt's rows come in runs, one per prefill chunk that computed them, in prompt order."""

    request_id: str
    first_position: int  # the prompt index of the token row 0 scores (>= 1: the first token has no logprob)
    token_logprobs: list[float]  # per row: the prompt token's logprob
    token_ranks: list[int]  # per row: its rank, 1 = the most likely
    top_token_ids: list[list[int]]  # per row: the top-N, most likely first
    top_logprobs: list[list[float]]


@dataclass(slots=True)
class RunnerOutput:
    # One entry per scheduled request with ``samples`` set, in scheduling order.
    sampled_request_ids: list[str]
    sampled_token_ids: list[int]
    logprobs: list[Optional[TokenLogprobs]] = field(default_factory=list)  # empty when none asked
    # Speculative decoding: row -> the tokens accepted after ``sampled_token_ids[row]`` (verified drafts,
    # then the token the model sampled after the last accepted one); None when the step had no drafts.
    accepted_token_ids: Optional[dict[int, list[int]]] = None
    # ... and their logprobs, aligned with them, for the rows whose request asked for logprobs.
    accepted_logprobs: Optional[dict[int, list[TokenLogprobs]]] = None
    # Prompt logprobs computed by this step (requests with prompt_logprobs in prefill); None: none.
    prompt_logprobs: Optional[list[PromptLogprobRows]] = None

    @property
    def num_tokens(self) -> int:
        """Tokens this step generated in all (several per row where drafts were accepted)."""
        extra = self.accepted_token_ids
        return len(self.sampled_token_ids) + (sum(map(len, extra.values())) if extra else 0)


@dataclass(slots=True)
class EngineCoreOutput:
    """A request's news from one step (new tokens and/or its end).

    Built positionally once per sampled token (Scheduler.update): keep the field order.
    """

    request_id: str
    new_token_ids: list[int]
    new_logprobs: list[TokenLogprobs]  # aligned with new_token_ids when logprobs were asked
    finish_reason: Optional[str] = None  # "stop" | "length" | "abort" once finished
    stop_reason: Optional[object] = None  # the stop token id that ended it (stop strings: set later)
    num_prompt_tokens: int = 0
    num_preemptions: int = 0
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache (at its first admission)
    # With its first token, for a request with prompt_logprobs: every row of its prompt, in order.
    prompt_logprobs: Optional[list[PromptLogprobRows]] = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
