"""Results handed to users (vLLM's shapes): RequestOutput with one CompletionOutput per sample."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass(slots=True)
class Logprob:
    logprob: float
    rank: int  # 1 = the most likely token
    decoded_token: Optional[str] = None


# One dict per generated token: token id -> Logprob (the sampled token and the top-N).
SampleLogprobs = list[dict[int, Logprob]]
# One entry per prompt token: None for the first (nothing before it), then token id -> Logprob (the
# prompt token, given the tokens before it, and the top-N at its position). vLLM's shape.
PromptLogprobs = list[Optional[dict[int, Logprob]]]


@dataclass(slots=True)
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: Optional[float] = None
    logprobs: Optional[SampleLogprobs] = None
    finish_reason: Optional[str] = None  # "stop" | "length" | "abort"
    stop_reason: object = None  # the stop string or stop token id that ended it, if any
    # The prompt logprobs of the engine request behind this output, for the RequestOutput built
    # around it (RequestOutput.prompt_logprobs takes them when not given); not part of vLLM's record.
    _prompt_logprobs: Optional[PromptLogprobs] = field(default=None, repr=False, compare=False)

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt: Optional[str]
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    metrics: dict = field(default_factory=dict)
    prompt_logprobs: Optional[PromptLogprobs] = None  # with SamplingParams.prompt_logprobs

    def __post_init__(self) -> None:
        # Every choice of a prompt scores the same prompt: the first output's serve the request.
        if self.prompt_logprobs is None and self.outputs:
            self.prompt_logprobs = getattr(self.outputs[0], "_prompt_logprobs", None)
