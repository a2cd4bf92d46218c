"""Engine logprobs (one ``{token_id: Logprob}`` dict per generated token) in OpenAI's two formats,
and prompt logprobs in vLLM's; and the server's bound on how many a response may carry.

Whole-vocabulary logprobs (-1) are ~50k-150k entries a position: a response's size grows with
positions x entries whatever ``max_logprobs`` allows, so ``check_logprobs_budget`` refuses, before
admission, what could exceed ``--max-logprob-entries``. Large positions are encoded to JSON as soon as
they are formatted (``orjson.Fragment``): one position's dicts exist at a time, not the whole response's.
"""

from __future__ import annotations

from typing import Callable, Optional

import orjson

from aioinfer.entrypoints.openai.errors import bad_request
from aioinfer.outputs import Logprob, PromptLogprobs
from aioinfer.sampling_params import SamplingParams, num_logprobs

_FLOOR = -9999.0  # -inf is not valid JSON; vLLM clamps to this value too
_STREAMED_FREELY = 20  # top-N a streamed position may ask without its generated tokens counting (OpenAI's max)
_ENCODE_AT = 64  # entries a position's JSON object may hold before it is encoded at once (orjson.Fragment)


def _encoded(value, size: int):
    """``value`` itself, or already encoded when it is large (the response's JSON is the same)."""
    return orjson.Fragment(orjson.dumps(value)) if size > _ENCODE_AT else value


def check_logprobs_budget(params: SamplingParams, prompt_lengths: list[int], n: int, engine, budget: int,
                          sample_param: str = "logprobs", prompt_param: str = "prompt_logprobs",
                          stream: bool = False) -> None:
    """400 naming the field when the response's logprobs could hold more than ``budget`` entries (the
    server's ``max_logprob_entries``): each choice's prompt positions and its most generated tokens
    (``max_tokens``, else the rest of the context), times the top-N and the token itself.
    ``prompt_lengths``: per prompt, in tokens; ``n``: choices per prompt.

    A stream's generated tokens are sent chunk by chunk, never held together: within OpenAI's and
    vLLM's default of 20 a position they are not counted (top_logprobs 20 with no max_tokens on a
    128k context would otherwise be refused); above it (a server that raised ``max_logprobs``, the
    whole vocabulary) they are, as a stalled client's backlog of such chunks grows fast."""
    if params.logprobs is None and params.prompt_logprobs is None:
        return
    vocab, context = engine.vocab_size, engine.max_model_len
    count_output = not stream or (params.logprobs is not None
                                  and num_logprobs(params.logprobs, vocab) > _STREAMED_FREELY)
    prompt_entries = output_entries = 0
    for length in prompt_lengths:
        room = max(0, context - length)
        most = room if params.max_tokens is None else min(params.max_tokens, room)
        prompt_entries += n * params.logprob_entries(length, vocab, 0)
        if count_output:
            output_entries += n * params.logprob_entries(0, vocab, most)
    total = prompt_entries + output_entries
    if total <= budget:
        return
    parts = [f"{prompt_entries} for the prompt"] if prompt_entries else []
    if output_entries:
        parts.append(f"{output_entries} for the generated tokens, up to "
                     + ("max_tokens" if params.max_tokens is not None
                        else "the rest of the context as max_tokens is unset"))
    choices = len(prompt_lengths) * n
    raise bad_request(
        f"the logprobs asked for could fill this response with {total} (token, logprob) entries ({', '.join(parts)}"
        + (f"; {choices} choices" if choices > 1 else "") + f"), more than this server's limit of {budget} "
        "(AIOINFER_MAX_LOGPROB_ENTRIES, --max-logprob-entries): ask for fewer logprobs, tokens or choices",
        param=prompt_param if prompt_entries >= output_entries else sample_param, code="logprobs_limit_exceeded")


def _value(lp: float) -> float:
    return max(lp, _FLOOR)


def _token_str(token_id: int, entry: Optional[Logprob], as_token_id: bool = False) -> str:
    if as_token_id or entry is None or entry.decoded_token is None:
        return f"token_id:{token_id}"
    return entry.decoded_token


def _top(entries: dict[int, Logprob], top_n: int) -> list[tuple[int, Logprob]]:
    """The entries of rank <= top_n, best first; top_n -1: all of them (the whole vocabulary)."""
    ranked = sorted(entries.items(), key=lambda kv: kv[1].rank)
    if top_n < 0:
        return ranked
    return [(tid, lp) for tid, lp in ranked if lp.rank <= top_n]


def _chosen_first(token_id: int, entries: dict[int, Logprob], top_n: int) -> list[tuple[int, Logprob]]:
    """vLLM's order of a position's top logprobs: the chosen token, then the top-N best first without it.

    vLLM's engine builds each position's dict with the sampled token first and its OpenAI routes keep
    that order (its tests read the chosen token at [0]); aioinfer's entries carry ranks instead, so
    the order is made here. Which entries each format keeps is its own rule (the callers')."""
    sampled = entries.get(token_id)
    ranked = [(tid, lp) for tid, lp in _top(entries, top_n) if tid != token_id]
    return ranked if sampled is None else [(token_id, sampled), *ranked]


class CompletionLogprobs:
    """Completions format: parallel lists plus ``text_offset`` (character offsets in the choice's text)."""

    def __init__(self, top_n: int, text_offset: int = 0, as_token_ids: bool = False,
                 decode: Optional[Callable[[int], str]] = None) -> None:
        self.top_n = top_n
        self.as_token_ids = as_token_ids  # vLLM's return_tokens_as_token_ids
        self.offset = text_offset  # where the next token starts (after an echoed prompt, if any)
        self.decode = decode  # a token's text, for a position without logprobs (an echoed prompt's first)

    def format(self, token_ids: list[int], entries: Optional[list[Optional[dict[int, Logprob]]]]) -> dict:
        """``entries``: one per token; None for a token without logprobs (the first of an echoed
        prompt: null logprob and top_logprobs, as OpenAI's legacy API)."""
        tokens, token_logprobs, top_logprobs, offsets = [], [], [], []
        for token_id, entry in zip(token_ids, entries or []):
            if entry is None:
                text = (f"token_id:{token_id}" if self.as_token_ids or self.decode is None
                        else self.decode(token_id))
                tokens.append(text)
                token_logprobs.append(None)
                top_logprobs.append(None)
                offsets.append(self.offset)
                self.offset += len(text)
                continue
            sampled = entry.get(token_id)
            text = _token_str(token_id, sampled, self.as_token_ids)
            tokens.append(text)
            token_logprobs.append(_value(sampled.logprob) if sampled is not None else None)
            # vLLM's shape: the sampled token first, then the top-N (N + 1 entries when the sampled
            # token is not among them, as OpenAI's legacy API), keyed by token text.
            top = {_token_str(tid, lp, self.as_token_ids): _value(lp.logprob)
                   for tid, lp in _chosen_first(token_id, entry, self.top_n)}
            top_logprobs.append(_encoded(top, len(top)))
            offsets.append(self.offset)
            self.offset += len(text)
        return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs,
                "text_offset": offsets}


def prompt_logprobs_json(entries: Optional[PromptLogprobs]) -> Optional[list]:
    """vLLM's ``prompt_logprobs``: per prompt token null (the first) or
    ``{"<token id>": {"logprob", "rank", "decoded_token"}}`` (the token itself and the top-N)."""
    if entries is None:
        return None
    return [None if entry is None else _encoded(
            {str(tid): {"logprob": _value(lp.logprob), "rank": lp.rank, "decoded_token": lp.decoded_token}
             for tid, lp in entry.items()}, len(entry))
            for entry in entries]


def merge_completion_logprobs(parts: list[dict]) -> Optional[dict]:
    if not parts:
        return None
    return {key: [v for part in parts for v in part[key]] for key in parts[0]}


def chat_logprobs(token_ids: list[int], entries: Optional[list[dict[int, Logprob]]], top_n: int,
                  as_token_ids: bool = False) -> dict:
    """Chat format: ``{"content": [{token, logprob, bytes, top_logprobs: [...]}, ...]}``;
    ``as_token_ids``: vLLM's return_tokens_as_token_ids (every token "token_id:<id>").

    ``top_logprobs`` as vLLM's: N entries (-1: all), the chosen token first, then the most likely
    others; a chosen token outside the top N takes the place of the N-th (vLLM's rule, kept so that
    a client reads the same list from either server)."""
    content = []
    for token_id, entry in zip(token_ids, entries or []):
        sampled = entry.get(token_id)
        text = _token_str(token_id, sampled, as_token_ids)
        chosen = _chosen_first(token_id, entry, top_n)
        top = [{"token": _token_str(tid, lp, as_token_ids), "logprob": _value(lp.logprob),
                "bytes": list(_token_str(tid, lp, as_token_ids).encode("utf-8"))}
               for tid, lp in (chosen if top_n < 0 else chosen[:top_n])]
        content.append({
            "token": text,
            "logprob": _value(sampled.logprob) if sampled is not None else _FLOOR,
            "bytes": list(text.encode("utf-8")),
            "top_logprobs": _encoded(top, len(top)),
        })
    return {"content": content}
