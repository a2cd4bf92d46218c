"""Turns the core's per-step token news into text deltas and finished outputs.

Runs where the user's results are delivered (the caller's thread offline, the event loop in the
async engine): incremental detokenization, stop strings, logprob dicts. A stop string ends a
request here, so the caller must tell the core to finish it (``stopped_by_string``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from aioinfer.core.scheduler_output import EngineCoreOutput, PromptLogprobRows, TokenLogprobs
from aioinfer.engine.delta import GenerationDelta
from aioinfer.outputs import CompletionOutput, Logprob, PromptLogprobs, SampleLogprobs
from aioinfer.sampling_params import SamplingParams
from aioinfer.text.detokenizer import byte_level_table, fast_backend
from aioinfer.text.text_accumulator import TextAccumulator


@dataclass(slots=True)
class _State:
    prompt: Optional[str]
    prompt_token_ids: list[int]
    params: SamplingParams
    text: Optional[TextAccumulator]
    num_prompt_tokens: int
    token_ids: list[int] = field(default_factory=list)
    logprobs: Optional[SampleLogprobs] = None
    cumulative_logprob: Optional[float] = None
    finish_reason: Optional[str] = None
    stop_reason: object = None
    num_cached_tokens: int = 0  # prompt tokens the prefix cache served (known from the first step on)
    awaiting_prompt_logprobs: bool = False  # prompt_logprobs asked: they come with the first token
    prompt_logprobs: Optional[PromptLogprobs] = None


class OutputProcessor:
    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self._states: dict[str, _State] = {}
        self._token_texts: dict[int, str] = {}  # token id -> its text alone (logprobs' decoded_token)
        backend = None if tokenizer is None else fast_backend(tokenizer)
        if backend is not None:
            byte_level_table(backend, skip_special_tokens=True)  # now, not on the first request's path

    def add_request(self, request_id: str, prompt: Optional[str], prompt_token_ids: list[int],
                    params: SamplingParams) -> None:
        text = None
        if self.tokenizer is not None:
            text = TextAccumulator(self.tokenizer, prompt_token_ids, params)
        self._states[request_id] = _State(
            prompt=prompt, prompt_token_ids=prompt_token_ids, params=params, text=text,
            num_prompt_tokens=len(prompt_token_ids),
            logprobs=[] if params.logprobs is not None else None,
            cumulative_logprob=0.0 if params.logprobs is not None else None,
            awaiting_prompt_logprobs=params.prompt_logprobs is not None,
        )

    def has(self, request_id: str) -> bool:
        return request_id in self._states

    def process(self, outputs: list[EngineCoreOutput]) -> tuple[list[GenerationDelta], list[str]]:
        """Returns (deltas, ids the core must finish because a stop string matched)."""
        deltas: list[GenerationDelta] = []
        stopped_by_string: list[str] = []
        for out in outputs:
            state = self._states.get(out.request_id)
            if state is None or state.finish_reason is not None:
                continue  # steps already in flight after a stop string: drop their tokens
            state.token_ids.extend(out.new_token_ids)
            state.num_cached_tokens = out.num_cached_tokens
            prompt_logprobs = None
            if state.awaiting_prompt_logprobs:  # its first output: the prompt's rows are all in it
                state.awaiting_prompt_logprobs = False
                prompt_logprobs = state.prompt_logprobs = self._prompt_logprobs(state, out.prompt_logprobs)
            new_logprobs = (None if state.logprobs is None
                            else self._logprobs(state, out.new_token_ids, out.new_logprobs))
            finish_reason, stop_reason = out.finish_reason, out.stop_reason
            new_text = ""
            text = state.text
            if text is not None:
                new_text = text.append_text(out.new_token_ids)
                if text.stop_reason is not None:
                    if finish_reason is None:
                        stopped_by_string.append(out.request_id)
                    finish_reason, stop_reason = "stop", text.stop_reason
                elif finish_reason is not None:
                    new_text += text.finish()
                    if text.stop_reason is not None:  # the held-back tail completed a stop string
                        finish_reason, stop_reason = "stop", text.stop_reason
            state.finish_reason, state.stop_reason = finish_reason, stop_reason
            # Positional (GenerationDelta's field order): one of these per token, on the event loop.
            deltas.append(GenerationDelta(
                out.request_id, out.new_token_ids, new_text, new_logprobs, finish_reason, stop_reason,
                state.num_prompt_tokens, len(state.token_ids), state.num_cached_tokens,
                state.prompt_token_ids, prompt_logprobs,
            ))
        return deltas, stopped_by_string

    def abort(self, request_id: str) -> Optional[GenerationDelta]:
        """Close a request that ended outside the step loop; returns its final delta if it was open."""
        state = self._states.get(request_id)
        if state is None or state.finish_reason is not None:
            return None
        state.finish_reason = "abort"
        return GenerationDelta(request_id=request_id, token_ids=[], text="", logprobs=None,
                               finish_reason="abort", num_prompt_tokens=len(state.prompt_token_ids),
                               num_output_tokens=len(state.token_ids), num_cached_tokens=state.num_cached_tokens,
                               prompt_token_ids=state.prompt_token_ids)

    def completion(self, request_id: str, index: int = 0) -> CompletionOutput:
        state = self._states[request_id]
        return CompletionOutput(
            index=index,
            text="" if state.text is None else state.text.text,  # the deltas' texts joined
            token_ids=list(state.token_ids),
            cumulative_logprob=state.cumulative_logprob,
            logprobs=state.logprobs,
            finish_reason=state.finish_reason,
            stop_reason=state.stop_reason,
            _prompt_logprobs=state.prompt_logprobs,
        )

    def num_cached_tokens(self, request_id: str) -> int:
        return self._states[request_id].num_cached_tokens

    def pop(self, request_id: str) -> None:
        self._states.pop(request_id, None)

    def _logprobs(self, state: _State, token_ids: list[int], rows: list[TokenLogprobs]) -> Optional[SampleLogprobs]:
        if state.logprobs is None or not rows:
            return None
        new: SampleLogprobs = []
        for token_id, row in zip(token_ids, rows):
            new.append(self._entry(token_id, row.sampled_logprob, row.sampled_rank, row.top_token_ids,
                                   row.top_logprobs))
            state.cumulative_logprob += row.sampled_logprob
        state.logprobs.extend(new)
        return new

    def _prompt_logprobs(self, state: _State, runs: Optional[list[PromptLogprobRows]]) -> PromptLogprobs:
        """vLLM's list: None for the first prompt token, then each token's entry, in prompt order."""
        prompt = state.prompt_token_ids
        entries: PromptLogprobs = [None]
        for rows in runs or ():
            assert rows.first_position == len(entries), "prompt logprob rows out of order or missing"
            for i, (logprob, rank) in enumerate(zip(rows.token_logprobs, rows.token_ranks)):
                entries.append(self._entry(prompt[len(entries)], logprob, rank, rows.top_token_ids[i],
                                           rows.top_logprobs[i]))
        assert len(entries) == len(prompt), f"{len(entries)} prompt logprob entries for {len(prompt)} tokens"
        return entries

    def _entry(self, token_id: int, logprob: float, rank: int, top_ids: list[int],
               top_logprobs: list[float]) -> dict[int, Logprob]:
        """One position's dict: the top-N by rank, and the token taken there (sampled or the prompt's)."""
        entry = {tid: Logprob(lp, r) for r, (tid, lp) in enumerate(zip(top_ids, top_logprobs), start=1)}
        entry[token_id] = Logprob(logprob, rank)
        if self.tokenizer is not None:
            for tid, text in zip(entry, self._texts(list(entry))):
                entry[tid].decoded_token = text
        return entry

    def _texts(self, token_ids: list[int]) -> list[str]:
        """Each token's text alone, decoded once per id: a whole-vocabulary entry (-1) would otherwise
        decode every id of the vocabulary again at every position."""
        cache = self._token_texts
        missing = [t for t in dict.fromkeys(token_ids) if t not in cache]
        if missing:
            cache.update(zip(missing, self.tokenizer.batch_decode([[t] for t in missing])))
        return [cache[t] for t in token_ids]
