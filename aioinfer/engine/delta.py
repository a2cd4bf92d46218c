"""GenerationDelta: what one request gained since the consumer last heard of it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from aioinfer.outputs import SampleLogprobs


@dataclass(slots=True)
class GenerationDelta:
    request_id: str
    token_ids: list[int]  # new token ids
    text: str  # new text (already checked against stop strings; joined deltas = the final text)
    logprobs: Optional[SampleLogprobs]  # one dict per new token, when logprobs were asked
    finish_reason: Optional[str] = None  # "stop" | "length" | "abort" on the last delta
    stop_reason: object = None  # the stop string or stop token id, if one ended it
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0  # total so far
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    prompt_token_ids: list[int] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def merge(self, later: "GenerationDelta") -> None:
        """Fold a later delta into this one (a slow consumer gets one merged delta, nothing dropped)."""
        self.token_ids = self.token_ids + later.token_ids
        self.text += later.text
        if later.logprobs is not None:
            self.logprobs = (self.logprobs or []) + later.logprobs
        self.finish_reason = later.finish_reason
        self.stop_reason = later.stop_reason
        self.num_output_tokens = later.num_output_tokens
        self.num_cached_tokens = later.num_cached_tokens
