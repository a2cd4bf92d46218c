"""Turns user input (text or token ids, SamplingParams) into scheduler Requests, validating it."""

from __future__ import annotations

import os
import random
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Optional, Sequence, Union

from aioinfer.inputs import TextPrompt, TokensPrompt, unwrap_prompt
from aioinfer.request import Request
from aioinfer.sampling_params import MAX_LOGPROBS, SamplingParams

PromptInput = Union[str, Sequence[int], TextPrompt, TokensPrompt]


def prompt_salt(prompt: PromptInput, cache_salt: Optional[str]) -> Optional[str]:
    """The cache salt a request gets: the caller's, else its prompt dict's (both: they must agree)."""
    if not isinstance(prompt, dict):
        return cache_salt
    _, own = unwrap_prompt(prompt)
    if own is not None and cache_salt is not None and own != cache_salt:
        raise ValueError("the prompt dict's cache_salt differs from the cache_salt argument")
    return own if own is not None else cache_salt


class InputProcessor:
    def __init__(self, tokenizer, vocab_size: int, max_model_len: int, eos_token_ids: tuple[int, ...],
                 seed: int = 0, max_logprobs: int = MAX_LOGPROBS, grammar_limits=None) -> None:
        self.tokenizer = tokenizer
        self.grammar_limits = grammar_limits  # structured_output.limits.GrammarLimits (None: their defaults)
        self.vocab_size = vocab_size
        self.max_logprobs = max_logprobs  # ModelConfig.max_logprobs
        self.max_model_len = max_model_len
        self.eos_token_ids = eos_token_ids
        self._seeds = random.Random(seed)  # draws the seeds of requests that did not give one
        self._grammars = None  # GrammarCompiler, made for the first request with structured outputs

    @property
    def grammars(self):
        """The compiler of structured outputs for this tokenizer (structured_output/compiler.py)."""
        if self._grammars is None:
            from aioinfer.structured_output.compiler import GrammarCompiler

            self._grammars = GrammarCompiler(self.tokenizer, self.vocab_size, self.eos_token_ids,
                                             limits=self.grammar_limits)
        return self._grammars

    def tokenize(self, prompt: PromptInput) -> tuple[Optional[str], list[int]]:
        """Returns (prompt text or None, prompt token ids); raises ValueError on bad input. A vLLM
        prompt dict (aioinfer/inputs.py) stands for its string or ids (its cache_salt: ``prompt_salt``)."""
        if isinstance(prompt, dict):
            prompt, _ = unwrap_prompt(prompt)
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this model has no tokenizer: pass prompts as token id lists")
            return prompt, list(self.tokenizer.encode(prompt))
        if isinstance(prompt, (bytes, dict)) or not isinstance(prompt, Sequence):
            raise ValueError(f"a prompt must be a string, a list of token ids or a prompt dict, "
                             f"got {type(prompt).__name__}")
        ids = list(prompt)
        # C-level passes first (a prompt is thousands of ids, and every request's ids pass here on
        # the event loop); the per-id Python checks only when one of them fails.
        if not ids or set(map(type, ids)) != {int}:
            if not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
                raise ValueError("prompt token ids must be integers")
        if ids and (min(ids) < 0 or max(ids) >= self.vocab_size):
            bad = [t for t in ids if not 0 <= t < self.vocab_size]
            raise ValueError(f"prompt token ids must be in [0, {self.vocab_size}), got {bad[:5]}")
        return None, ids

    def compile_ahead(self, constraints: Sequence) -> list:
        """Matchers for many requests' ``StructuredOutputsParams`` at once, in order, built by a few
        threads side by side (llguidance drops the GIL while it builds one: 0.4 ms to a few ms each,
        which a batch of 256 spent one by one on the engine's thread). Raises ``InvalidGrammarError``
        as ``make_request`` would, before any request exists."""
        if len(constraints) < 2:
            return [self.grammars.compile(c) for c in constraints]
        with ThreadPoolExecutor(min(8, len(constraints), os.cpu_count() or 1),
                                thread_name_prefix="aioinfer-compile") as pool:
            return list(pool.map(self.grammars.compile, constraints))

    def make_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                     priority: int = 0, arrival_time: Optional[float] = None,
                     cache_salt: Optional[str] = None, grammar=None) -> Request:
        """``grammar``: a matcher ``compile_ahead`` built for ``params.structured_outputs`` (else built now)."""
        if not prompt_token_ids:
            raise ValueError("the prompt must contain at least one token")
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise ValueError(f"priority must be an integer, got {priority!r}")
        if cache_salt is not None and (not isinstance(cache_salt, str) or not cache_salt):
            raise ValueError("cache_salt must be a non-empty string")
        params.validate_for_vocab(self.vocab_size)
        params.validate_logprobs_cap(self.max_logprobs, self.vocab_size)
        num_prompt = len(prompt_token_ids)
        params.validate_for_prompt(num_prompt, self.vocab_size)  # whole-vocabulary prompt logprobs' bound
        if params.max_tokens is None:
            max_tokens = self.max_model_len - num_prompt
            if max_tokens < 1:
                raise ValueError(
                    f"This model's maximum context length is {self.max_model_len} tokens. However, the prompt "
                    f"has {num_prompt} tokens, which leaves no room for the completion.")
        else:
            max_tokens = params.max_tokens
        # Its own matcher (built ahead by prepare, or now): raises InvalidGrammarError before anything is queued.
        if grammar is None and params.structured_outputs is not None:
            grammar = self.grammars.compile(params.structured_outputs)
        return Request(
            request_id=request_id,
            prompt_token_ids=prompt_token_ids,
            sampling_params=params,
            max_tokens=max_tokens,
            eos_token_ids=self.eos_token_ids,
            arrival_time=time.monotonic() if arrival_time is None else arrival_time,
            priority=priority,
            cache_salt=cache_salt,
            seed=params.seed if params.seed is not None else self._seeds.getrandbits(63),
            grammar=grammar,
        )
