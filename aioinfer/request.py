"""A request's scheduling state (pure Python: the scheduler never imports torch)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Optional

from aioinfer.sampling_params import SamplingParams


class RequestStatus(enum.IntEnum):
    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2  # back in the waiting queue, its KV dropped (recompute)
    SWAPPED = 3  # back in the waiting queue, its KV in a run of host blocks (swap-in resumes it)
    FINISHED_STOPPED = 4  # EOS, a stop token or a stop string
    FINISHED_LENGTH = 5  # max_tokens or the model's context length
    FINISHED_ABORTED = 6
    # Its structured-output constraint could not be kept (the grammar engine met one of its limits,
    # or a dead end, mid-output): the text does not match it (engine_core.py)
    FINISHED_ERROR = 7

    @property
    def finished(self) -> bool:
        return self >= RequestStatus.FINISHED_STOPPED

    @property
    def finish_reason(self) -> Optional[str]:
        """OpenAI's finish_reason for a finished status."""
        return _FINISH_REASONS.get(self)


_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
    RequestStatus.FINISHED_ERROR: "error",
}


@dataclass(slots=True, eq=False)
class Request:
    """One sequence being generated.

    The scheduling rule is vLLM v1's: ``num_computed_tokens`` catches up with ``num_tokens``
    (prompt + output so far); a step grants each request some of the difference. A prompt
    larger than the budget takes several grants (chunked prefill); a request whose computed
    tokens reach ``num_tokens`` samples one more token.
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    max_tokens: int  # resolved: the user's max_tokens or what the context length leaves
    eos_token_ids: tuple[int, ...] = ()
    arrival_time: float = 0.0  # seconds (time.monotonic) when the engine accepted it
    priority: int = 0  # lower runs first (vLLM's convention)
    seed: int = 0  # effective sampling seed
    cache_salt: Optional[str] = None  # part of the prefix-cache key: equal salts (tenants) share prefixes
    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0  # tokens whose KV is in the cache (or being computed by a launched step)
    num_pending_tokens: int = 0  # sampled by a launched step, not yet known on the host (async scheduling)
    num_preemptions: int = 0
    stop_reason: Optional[object] = None  # the stop token id or stop string that ended it
    # Set by the scheduler and the KV cache manager:
    order_key: tuple[int, int] = (0, 0)  # (aged priority, arrival sequence): scheduling order, smallest first
    block_hashes: list[int] = field(default_factory=list)  # chained prefix-cache keys of its full blocks so far
    num_cached_tokens: Optional[int] = None  # prompt tokens found in the prefix cache at first admission
    host_run_start: Optional[int] = None  # SWAPPED: first host block of its KV (cdiv(computed, block_size) long)
    # Set by the scheduler when it accepts the request, for the per-token stop test: below this many
    # output tokens, and with a token outside ``stop_candidates``, a request cannot stop.
    length_limit: int = 0
    stop_candidates: frozenset = frozenset()
    # Speculative decoding (spec_decode/policy.py), set and used only when the engine has it:
    num_draft_tokens: int = 0  # drafts granted in the step in flight (verified and rolled back by update)
    draft_wait: int = 0  # decode grants to let pass before the next draft attempt
    draft_backoff: int = 0  # the last wait (doubles after an attempt without an accepted draft)
    draft_yield: Optional[float] = None  # decaying average of its attempts' accepted tokens (None: none yet)
    ngram_index: Optional[object] = None  # its NgramIndex, built at its first draft attempt
    num_draft_tokens_total: int = 0  # drafts verified over its life
    num_accepted_tokens_total: int = 0  # of those, accepted
    # Structured outputs: its llguidance matcher (structured_output/compiler.py), advanced by the model
    # runner with every token it samples; None without a constraint.
    grammar: Optional[object] = None
    # Prompt logprobs (sampling_params.prompt_logprobs): the runs of rows computed so far
    # (PromptLogprobRows), kept until they leave with the first token (Scheduler.update).
    prompt_logprob_rows: Optional[list] = None

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def needs_prompt_logits(self) -> bool:
        """Prompt logprobs asked and not all computed yet (they are once the first token is known):
        every prompt position must then be computed, none served from the prefix cache."""
        return self.sampling_params.prompt_logprobs is not None and not self.output_token_ids

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    def token_ids_slice(self, start: int, end: int) -> list[int]:
        """Tokens ``start:end`` of prompt + output, without concatenating the whole sequence."""
        n_prompt = len(self.prompt_token_ids)
        if end <= n_prompt:
            return self.prompt_token_ids[start:end]
        if start >= n_prompt:
            return self.output_token_ids[start - n_prompt:end - n_prompt]
        return self.prompt_token_ids[start:] + self.output_token_ids[:end - n_prompt]

    @property
    def finish_reason(self) -> Optional[str]:
        return self.status.finish_reason
