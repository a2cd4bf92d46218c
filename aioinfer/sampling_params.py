"""User-facing sampling options, validated on construction (vLLM's names and defaults)."""

from __future__ import annotations

import copy
import enum
from dataclasses import dataclass, field
from typing import Optional, Union

from aioinfer.structured_output.params import StructuredOutputsParams

_GREEDY_EPSILON = 1e-5  # temperatures below this are treated as greedy, as in vLLM
MAX_LOGPROBS = 20  # top-N cap of ``logprobs`` and ``prompt_logprobs`` (vLLM's default max_logprobs)
WHOLE_VOCAB = -1  # ``logprobs`` / ``prompt_logprobs`` value asking for every vocabulary entry (vLLM's -1)
# What a WHOLE_VOCAB request may ask for in all: positions x vocabulary entries. Each entry becomes a
# Logprob object and, on the server, JSON (~150 bytes together): 2**23 is ~1.2 GB of host memory at
# worst, and 55 positions of a 151k vocabulary (a short chat prompt, or a few generated tokens).
MAX_WHOLE_VOCAB_ENTRIES = 1 << 23


class RequestOutputKind(enum.IntEnum):
    """vLLM's: what each RequestOutput of a stream (``AsyncLLM.generate``) carries."""

    CUMULATIVE = 0  # everything so far
    DELTA = 1  # only what is new
    FINAL_ONLY = 2  # one output, at the end


@dataclass(slots=True)
class SamplingParams:
    """How to pick tokens and when to stop. Invalid values raise ``ValueError`` naming the field."""

    n: int = 1  # completions per prompt
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0  # nucleus mass in (0, 1]
    top_k: int = 0  # 0 or -1: all tokens
    min_p: float = 0.0  # drop tokens below min_p * p(max), in [0, 1]
    seed: Optional[int] = None  # per-request seed: same seed, same tokens whatever the batch
    presence_penalty: float = 0.0  # [-2, 2], subtracted once per token present in the output
    frequency_penalty: float = 0.0  # [-2, 2], subtracted per occurrence in the output
    repetition_penalty: float = 1.0  # > 0; divides positive / multiplies negative logits of seen tokens
    logit_bias: Optional[dict[int, float]] = None  # token id -> bias added to its logit, in [-100, 100]
    stop: Union[str, list[str], None] = None  # stop strings, matched on the decoded text
    stop_token_ids: Optional[list[int]] = None  # tokens that end the request (beside EOS)
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    max_tokens: Optional[int] = 16  # None: up to the model's context length
    min_tokens: int = 0  # EOS and stop tokens are masked until this many tokens were generated
    logprobs: Optional[int] = None  # top-N logprobs per generated token (the sampled one always included); -1: all
    # top-N logprobs per prompt token, of the token given the ones before it (the prompt token itself
    # always included; the first token has none); -1: all. RequestOutput.prompt_logprobs
    prompt_logprobs: Optional[int] = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    # The output must match a JSON schema, regex, choice or grammar (a dict is taken as its fields).
    structured_outputs: Optional[StructuredOutputsParams] = None
    # vLLM's: the outputs a stream of AsyncLLM.generate yields (the offline LLM returns final outputs)
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    # Filled in by the engine from the tokenizer / generation_config; not user-facing.
    _eos_token_ids: tuple[int, ...] = field(default=(), repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        elif self.stop is None:
            self.stop = []
        else:
            self.stop = list(self.stop)
        self.stop_token_ids = list(self.stop_token_ids or [])
        try:
            self.output_kind = RequestOutputKind(self.output_kind)
        except ValueError:
            raise ValueError(f"output_kind must be a RequestOutputKind, got {self.output_kind!r}") from None
        if self.logit_bias is not None:
            try:
                self.logit_bias = {int(k): float(v) for k, v in self.logit_bias.items()}
            except (TypeError, ValueError, AttributeError) as exc:
                raise ValueError(f"logit_bias must map token ids to numbers, got {self.logit_bias!r}") from exc
        if isinstance(self.structured_outputs, dict):
            self.structured_outputs = StructuredOutputsParams(**self.structured_outputs)
        elif self.structured_outputs is not None and not isinstance(self.structured_outputs, StructuredOutputsParams):
            raise ValueError(f"structured_outputs must be StructuredOutputsParams, got "
                             f"{type(self.structured_outputs).__name__}")
        self._validate()
        if self.temperature < _GREEDY_EPSILON:
            # Greedy: the other sampling knobs do not apply.
            self.temperature = 0.0
            self.top_p, self.top_k, self.min_p = 1.0, 0, 0.0
        if self.top_k == -1:
            self.top_k = 0

    def _validate(self) -> None:
        def check(ok: bool, name: str, message: str) -> None:
            if not ok:
                raise ValueError(f"{name} {message}, got {getattr(self, name)!r}")

        check(_is_int(self.n) and self.n >= 1, "n", "must be an integer >= 1")
        check(_is_number(self.temperature) and self.temperature >= 0, "temperature", "must be >= 0")
        check(_is_number(self.top_p) and 0 < self.top_p <= 1, "top_p", "must be in (0, 1]")
        check(_is_int(self.top_k) and (self.top_k >= 0 or self.top_k == -1), "top_k",
              "must be -1 (disable), 0 (disable) or a positive integer")
        check(_is_number(self.min_p) and 0 <= self.min_p <= 1, "min_p", "must be in [0, 1]")
        check(self.seed is None or _is_int(self.seed), "seed", "must be an integer or None")
        check(_is_number(self.presence_penalty) and -2 <= self.presence_penalty <= 2,
              "presence_penalty", "must be in [-2, 2]")
        check(_is_number(self.frequency_penalty) and -2 <= self.frequency_penalty <= 2,
              "frequency_penalty", "must be in [-2, 2]")
        check(_is_number(self.repetition_penalty) and self.repetition_penalty > 0,
              "repetition_penalty", "must be > 0")
        check(self.max_tokens is None or (_is_int(self.max_tokens) and self.max_tokens >= 1),
              "max_tokens", "must be an integer >= 1 or None")
        check(_is_int(self.min_tokens) and self.min_tokens >= 0, "min_tokens", "must be an integer >= 0")
        if self.max_tokens is not None:
            check(self.min_tokens <= self.max_tokens, "min_tokens", "must be <= max_tokens")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            # The cap is the engine's (max_logprobs, validate_logprobs_cap), as vLLM's.
            check(value is None or (_is_int(value) and (value >= 0 or value == WHOLE_VOCAB)),
                  name, "must be an integer >= 0, -1 (the whole vocabulary) or None")
        check(all(isinstance(s, str) and s for s in self.stop), "stop", "must be non-empty strings")
        check(all(_is_int(t) and t >= 0 for t in self.stop_token_ids), "stop_token_ids",
              "must be non-negative integers")
        if self.logit_bias:
            check(all(k >= 0 and -100 <= v <= 100 for k, v in self.logit_bias.items()), "logit_bias",
                  "must map non-negative token ids to values in [-100, 100]")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def validate_for_vocab(self, vocab_size: int) -> None:
        """Token ids the caller named must exist in the model's vocabulary; whole-vocabulary logprobs
        of generated tokens must stay within ``MAX_WHOLE_VOCAB_ENTRIES``."""
        for name, ids in (("stop_token_ids", self.stop_token_ids),
                          ("logit_bias", list(self.logit_bias or ()))):
            bad = [t for t in ids if t >= vocab_size]
            if bad:
                raise ValueError(f"{name} holds token ids outside the vocabulary (size {vocab_size}): {bad[:5]}")
        if self.logprobs == WHOLE_VOCAB:
            limit = max(1, MAX_WHOLE_VOCAB_ENTRIES // vocab_size)
            if self.max_tokens is None or self.max_tokens > limit:
                raise ValueError(f"logprobs -1 (all {vocab_size} vocabulary entries a token) needs max_tokens "
                                 f"<= {limit}, got {self.max_tokens!r}")

    def validate_logprobs_cap(self, max_logprobs: int, vocab_size: int) -> None:
        """vLLM's rule: the logprobs a position may get, -1 counting as the vocabulary, are at most the
        engine's ``max_logprobs`` (20 unless set; -1 there: the vocabulary), and never more than the
        vocabulary whatever the cap (the step's top-k would fail on the engine's thread and end the
        engine). Raises ``LogprobsCapExceeded``."""
        cap = vocab_size if max_logprobs == WHOLE_VOCAB else min(max_logprobs, vocab_size)
        for name, kind in (("logprobs", "sample"), ("prompt_logprobs", "prompt")):
            value = getattr(self, name)
            wanted = vocab_size if value == WHOLE_VOCAB else value
            if wanted is not None and wanted > cap:
                asked = f"{wanted} (-1: the whole vocabulary)" if value == WHOLE_VOCAB else str(wanted)
                limit = (f"the vocabulary's {vocab_size} tokens" if cap == vocab_size and max_logprobs != cap
                         else f"this engine's max_logprobs, {cap} (vLLM's option and --max-logprobs)")
                raise LogprobsCapExceeded(name, f"{asked} {kind} logprobs a position asked for, more than {limit}")

    def logprob_entries(self, num_prompt_tokens: int, vocab_size: int, max_output_tokens: int) -> int:
        """How many (token, logprob) entries this request's output may hold: each prompt position after
        the first, and each of up to ``max_output_tokens`` generated tokens, gets the top-N and the token
        itself. What a response's size (and the host memory behind it) grows with; the server bounds it
        (``--max-logprob-entries``)."""
        def per_position(value: Optional[int]) -> int:
            return 0 if value is None else min(num_logprobs(value, vocab_size) + 1, vocab_size)

        return (max(0, num_prompt_tokens - 1) * per_position(self.prompt_logprobs)
                + max(0, max_output_tokens) * per_position(self.logprobs))

    def validate_for_prompt(self, num_prompt_tokens: int, vocab_size: int) -> None:
        """Whole-vocabulary prompt logprobs must stay within ``MAX_WHOLE_VOCAB_ENTRIES``."""
        if self.prompt_logprobs == WHOLE_VOCAB and num_prompt_tokens * vocab_size > MAX_WHOLE_VOCAB_ENTRIES:
            raise ValueError(f"prompt_logprobs -1 (all {vocab_size} vocabulary entries a prompt token) takes "
                             f"prompts of at most {max(1, MAX_WHOLE_VOCAB_ENTRIES // vocab_size)} tokens, "
                             f"got {num_prompt_tokens}")

    def clone(self) -> "SamplingParams":
        """An independent copy. Every field is immutable but the containers ``stop``,
        ``stop_token_ids`` and ``logit_bias``, whose items are immutable: copying those three
        is a deep copy, for a fraction of ``copy.deepcopy``'s cost (one per choice per request)."""
        new = copy.copy(self)
        new.stop = list(self.stop)
        new.stop_token_ids = list(self.stop_token_ids)
        if self.logit_bias is not None:
            new.logit_bias = dict(self.logit_bias)
        return new


class LogprobsCapExceeded(ValueError):
    """A request asked for more logprobs a position than the engine's ``max_logprobs``; ``field``:
    ``logprobs`` or ``prompt_logprobs``."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def num_logprobs(value: int, vocab_size: int) -> int:
    """How many top entries a ``logprobs`` / ``prompt_logprobs`` value asks for (-1: the vocabulary)."""
    return vocab_size if value == WHOLE_VOCAB else value


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value  # not NaN
