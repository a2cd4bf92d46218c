"""Engine logprobs (one ``{token_id: Logprob}`` dict per generated token) in OpenAI's two formats,
and prompt logprobs in vLLM's."""

from __future__ import annotations

from typing import Callable, Optional

from aioinfer.outputs import Logprob, PromptLogprobs

_FLOOR = -9999.0  # -inf is not valid JSON; vLLM clamps to this value too


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
            # vLLM's shape: the top-N plus the sampled token, keyed by token text.
            top = {_token_str(tid, lp, self.as_token_ids): _value(lp.logprob) for tid, lp in _top(entry, self.top_n)}
            if sampled is not None:
                top.setdefault(text, _value(sampled.logprob))
            top_logprobs.append(top)
            offsets.append(self.offset)
            self.offset += len(text)
        return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs,
                "text_offset": offsets}


def prompt_logprobs_json(entries: Optional[PromptLogprobs]) -> Optional[list]:
    """vLLM's ``prompt_logprobs``: per prompt token null (the first) or
    ``{"<token id>": {"logprob", "rank", "decoded_token"}}`` (the token itself and the top-N)."""
    if entries is None:
        return None
    return [None if entry is None else
            {str(tid): {"logprob": _value(lp.logprob), "rank": lp.rank, "decoded_token": lp.decoded_token}
             for tid, lp in entry.items()}
            for entry in entries]


def merge_completion_logprobs(parts: list[dict]) -> Optional[dict]:
    if not parts:
        return None
    return {key: [v for part in parts for v in part[key]] for key in parts[0]}


def chat_logprobs(token_ids: list[int], entries: Optional[list[dict[int, Logprob]]], top_n: int,
                  as_token_ids: bool = False) -> dict:
    """Chat format: ``{"content": [{token, logprob, bytes, top_logprobs: [...]}, ...]}``;
    ``as_token_ids``: vLLM's return_tokens_as_token_ids (every token "token_id:<id>")."""
    content = []
    for token_id, entry in zip(token_ids, entries or []):
        sampled = entry.get(token_id)
        text = _token_str(token_id, sampled, as_token_ids)
        content.append({
            "token": text,
            "logprob": _value(sampled.logprob) if sampled is not None else _FLOOR,
            "bytes": list(text.encode("utf-8")),
            "top_logprobs": [{"token": _token_str(tid, lp, as_token_ids), "logprob": _value(lp.logprob),
                              "bytes": list(_token_str(tid, lp, as_token_ids).encode("utf-8"))}
                             for tid, lp in _top(entry, top_n)],
        })
    return {"content": content}
