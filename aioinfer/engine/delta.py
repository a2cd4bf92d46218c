"""GenerationDelta: what one request gained since the consumer last heard of it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from aioinfer.outputs import PromptLogprobs, SampleLogprobs


@dataclass(slots=True)
class GenerationDelta:
    request_id: str
    token_ids: list[int]  # new token ids
    text: str  # new text (already checked against stop strings; joined deltas = the final text)
    logprobs: Optional[SampleLogprobs]  # one dict per new token, when logprobs were asked
    finish_reason: Optional[str] = None  # "stop" | "length" | "abort" | "error" (request.py) on the last delta
    stop_reason: object = None  # the stop string or stop token id, if one ended it
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0  # total so far
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    prompt_token_ids: list[int] = field(default_factory=list)
    prompt_logprobs: Optional[PromptLogprobs] = None  # on the delta with the first token, when asked

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
        if self.prompt_logprobs is None:
            self.prompt_logprobs = later.prompt_logprobs


class DeltaMerger:
    """Folds a run of deltas into one in linear time, for where many pile up: a non-streaming
    request's whole output, a slow consumer's overflow, a consumer's backlog. (``merge`` copies
    the lists and text on every call, quadratic over a long run.)"""

    __slots__ = ("_first", "_last", "_token_ids", "_texts", "_logprobs", "_prompt_logprobs")

    def __init__(self, first: GenerationDelta) -> None:
        self._first = self._last = first
        self._prompt_logprobs = first.prompt_logprobs
        # Copies: a delta's lists may be the core's own (never extend them in place).
        self._token_ids = list(first.token_ids)
        self._texts = [first.text]
        self._logprobs = None if first.logprobs is None else list(first.logprobs)

    @property
    def finished(self) -> bool:
        return self._last.finish_reason is not None

    @property
    def num_tokens(self) -> int:
        return len(self._token_ids)

    def add(self, later: GenerationDelta) -> None:
        self._last = later
        self._token_ids += later.token_ids
        if later.text:
            self._texts.append(later.text)
        if self._prompt_logprobs is None:
            self._prompt_logprobs = later.prompt_logprobs
        if later.logprobs is not None:
            if self._logprobs is None:
                self._logprobs = list(later.logprobs)
            else:
                self._logprobs += later.logprobs

    def result(self) -> GenerationDelta:
        """The merged delta (equal to ``first.merge(d)`` for every later ``d``, in order)."""
        first, last = self._first, self._last
        if first is last:
            return first
        return GenerationDelta(
            request_id=first.request_id,
            token_ids=self._token_ids,
            text="".join(self._texts),
            logprobs=self._logprobs,
            finish_reason=last.finish_reason,
            stop_reason=last.stop_reason,
            num_prompt_tokens=first.num_prompt_tokens,
            num_output_tokens=last.num_output_tokens,
            num_cached_tokens=last.num_cached_tokens,
            prompt_token_ids=first.prompt_token_ids,
            prompt_logprobs=self._prompt_logprobs,
        )
