"""Request bodies -> ``SamplingParams`` (one per choice: the server fans ``n`` out itself)."""

from __future__ import annotations

from typing import Any, Mapping, Optional

from aioinfer.entrypoints.openai.errors import APIError, bad_request
from aioinfer.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest, _SamplingFields
from aioinfer.entrypoints.openai.structured import structured_outputs_of
from aioinfer.sampling_params import LogprobsCapExceeded, SamplingParams

# Fields whose default, when the request leaves them out, may come from the model's
# generation_config.json (vLLM's `--generation-config auto`); otherwise OpenAI's defaults apply.
_MODEL_DEFAULT_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def completion_params(req: CompletionRequest, model_defaults: Optional[Mapping[str, Any]] = None) -> SamplingParams:
    if req.suffix is not None:
        raise bad_request("suffix is not supported", param="suffix", code="unsupported_parameter")
    if req.best_of is not None and req.best_of not in (1, req.n):
        raise bad_request("best_of must be 1 or equal to n (no server-side ranking)", param="best_of",
                          code="unsupported_parameter")
    # echo with logprobs: the echoed prompt's tokens get logprobs too, as the legacy OpenAI API gave
    # them (vLLM: prompt_logprobs default to logprobs then).
    prompt_logprobs = req.prompt_logprobs
    if prompt_logprobs is None and req.echo:
        prompt_logprobs = req.logprobs
    return _build(req, model_defaults, max_tokens=req.max_tokens, logprobs=req.logprobs,
                  prompt_logprobs=prompt_logprobs)


def chat_params(req: ChatCompletionRequest, model_defaults: Optional[Mapping[str, Any]] = None,
                tool_constraint=None) -> SamplingParams:
    """``tool_constraint``: the structured output a required or named tool_choice imposes (tool_calls.py)."""
    if req.top_logprobs is not None and not req.logprobs:
        raise bad_request("top_logprobs needs logprobs to be true", param="top_logprobs")
    if req.max_tokens is not None and req.max_completion_tokens is not None \
            and req.max_tokens != req.max_completion_tokens:
        raise bad_request("max_tokens and max_completion_tokens disagree; send one", param="max_tokens")
    # None: up to the end of the context (vLLM's chat default), decided by the engine.
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    logprobs = (req.top_logprobs or 0) if req.logprobs else None  # top_logprobs -1: the whole vocabulary
    return _build(req, model_defaults, max_tokens=max_tokens, logprobs=logprobs, constraint=tool_constraint,
                  prompt_logprobs=req.prompt_logprobs)


def _build(req: _SamplingFields, model_defaults: Optional[Mapping[str, Any]], *, max_tokens: Optional[int],
           logprobs: Optional[int], constraint=None, prompt_logprobs: Optional[int] = None) -> SamplingParams:
    if req.stream_options is not None and not req.stream:
        raise bad_request("stream_options is only allowed when stream is true", param="stream_options")
    if req.stream and req.prompt_logprobs is not None and req.prompt_logprobs != 0:
        # vLLM's rule, 0 passing as there (a stream has no field for them: completions' echo + logprobs
        # is how a stream gets the prompt's logprobs).
        raise bad_request("prompt_logprobs are not available when stream is true", param="prompt_logprobs")
    defaults = dict(model_defaults or {})
    kwargs: dict[str, Any] = {}
    for key in _MODEL_DEFAULT_KEYS:
        value = getattr(req, key)
        if value is None:
            value = defaults.get(key)
        if value is not None:
            kwargs[key] = value
    for key in ("presence_penalty", "frequency_penalty"):
        if getattr(req, key) is not None:
            kwargs[key] = getattr(req, key)
    if req.min_tokens and max_tokens is not None and req.min_tokens > max_tokens:
        raise bad_request(f"min_tokens ({req.min_tokens}) must be <= max_tokens ({max_tokens})", param="min_tokens")
    kwargs.update(
        n=1,
        seed=req.seed,
        stop=req.stop,
        stop_token_ids=req.stop_token_ids,
        logit_bias={int(k): v for k, v in req.logit_bias.items()} if req.logit_bias else None,
        ignore_eos=req.ignore_eos,
        max_tokens=max_tokens,
        min_tokens=req.min_tokens,
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
        include_stop_str_in_output=req.include_stop_str_in_output,
        skip_special_tokens=req.skip_special_tokens,
        spaces_between_special_tokens=req.spaces_between_special_tokens,
        structured_outputs=_constraint(req, constraint),
    )
    try:
        return SamplingParams(**kwargs)
    except ValueError as exc:
        raise _named(exc) from None


def _constraint(req: _SamplingFields, tool_constraint):
    requested = structured_outputs_of(req)
    if tool_constraint is None:
        return requested
    if requested is not None:
        raise bad_request("a required or named tool_choice constrains the output already; drop response_format "
                          "(or the structured_outputs / guided_* field)", param="tool_choice")
    return tool_constraint


def check_logprobs_cap(params: SamplingParams, engine, sample_param: str = "logprobs") -> None:
    """400 naming the request's field when it asks for more logprobs a position than the engine's
    ``max_logprobs`` (``--max-logprobs``; the engine checks again at admission). ``sample_param``:
    the field that asked for the sampled tokens' (chat: ``top_logprobs``)."""
    try:
        params.validate_logprobs_cap(engine.max_logprobs, engine.vocab_size)
    except LogprobsCapExceeded as exc:
        raise bad_request(str(exc), param=sample_param if exc.field == "logprobs" else exc.field) from None


def choice_params(base: SamplingParams, index: int) -> SamplingParams:
    """The params of choice ``index``: seed + index when seeded, as the offline ``LLM`` does for n > 1."""
    params = base.clone()
    if base.seed is not None:
        params.seed = base.seed + index
    return params


def _named(exc: ValueError) -> APIError:
    # SamplingParams' messages start with the field name ("top_p must be in (0, 1], got 2").
    message = str(exc)
    first = message.split(" ", 1)[0]
    param = first if first in SamplingParams.__dataclass_fields__ else None
    return bad_request(message, param=param)
