"""POST /v1/completions: OpenAI's legacy completions (prompt forms x n choices), streamed or not."""

from __future__ import annotations

from contextlib import aclosing
from typing import AsyncIterator, Optional

from quart import Response

from aioinfer.entrypoints.openai.errors import bad_request, from_engine_error
from aioinfer.entrypoints.openai.fanout import ChoiceSpec, ChoiceStreams
from aioinfer.entrypoints.openai.logprobs import (
    CompletionLogprobs,
    check_logprobs_budget,
    merge_completion_logprobs,
    prompt_logprobs_json,
)
from aioinfer.entrypoints.openai.protocol import CompletionRequest
from aioinfer.entrypoints.openai.sampling import check_logprobs_cap, choice_params, completion_params
from aioinfer.entrypoints.openai.server_state import ServerState
from aioinfer.entrypoints.openai.structured import with_server_defaults
from aioinfer.entrypoints.openai.serving_common import (
    ChoiceResult,
    admit_and_respond,
    check_not_shut_down,
    engine_for,
    new_request_id,
    now,
    parse_body,
    stop_reason_json,
    stream_error_event,
    stream_usage,
    tokens_as_ids,
    usage,
)
from aioinfer.entrypoints.openai.sse import DONE, EventTemplate, event, text_marker


async def create_completion(state: ServerState, body: bytes, client_id: Optional[str] = None) -> Response:
    req = parse_body(CompletionRequest, body)
    prompts = [req.prompt] if isinstance(req.prompt, str) or isinstance(req.prompt[0], int) else req.prompt
    engine = engine_for(state, req, len(prompts))
    base = completion_params(req, state.model_defaults())
    with_server_defaults(base, state.config.disable_additional_properties)
    check_logprobs_cap(base, engine)
    prompt_ids = [_tokenize(engine, p, req.add_special_tokens) for p in prompts]
    # echo + logprobs asks for the prompt's logprobs through logprobs (sampling.completion_params)
    check_logprobs_budget(base, [len(ids) for ids in prompt_ids], req.n, engine, state.config.max_logprob_entries,
                          prompt_param="prompt_logprobs" if req.prompt_logprobs is not None else "logprobs",
                          stream=bool(req.stream))
    echoes = [_echo_text(engine, p, ids) if req.echo else "" for p, ids in zip(prompts, prompt_ids)]

    request_id = new_request_id("cmpl", client_id)
    specs = [ChoiceSpec(index=pi * req.n + i, prompt_index=pi, prompt=ids, params=choice_params(base, i))
             for pi, ids in enumerate(prompt_ids) for i in range(req.n)]
    job = _Job(req, request_id, state.served_model_name, specs, prompt_ids, echoes,
               force_usage=state.config.enable_force_include_usage,
               tokens_as_ids=tokens_as_ids(req, state), decode=_token_decoder(engine),
               prompt_logprobs=base.prompt_logprobs is not None)
    return await admit_and_respond(engine, specs, request_id, req, job)


def _tokenize(engine, prompt, add_special_tokens: bool) -> list[int]:
    try:
        if isinstance(prompt, str) and not add_special_tokens:
            if engine.tokenizer is None:
                raise ValueError("this model has no tokenizer: pass prompts as token id lists")
            return engine.tokenize(list(engine.tokenizer.encode(prompt, add_special_tokens=False)))
        return engine.tokenize(prompt)
    except ValueError as exc:
        raise bad_request(str(exc), param="prompt") from None
    except Exception as exc:  # noqa: BLE001 - engine stopped or died meanwhile
        raise from_engine_error(exc) from exc


def _token_decoder(engine):
    """A token's text alone: for an echoed prompt's first token, which has no logprobs entry to name it."""
    tokenizer = engine.tokenizer
    return None if tokenizer is None else (lambda token_id: tokenizer.decode([token_id]))


def _echo_text(engine, prompt, ids: list[int]) -> str:
    if isinstance(prompt, str):
        return prompt
    return engine.tokenizer.decode(ids) if engine.tokenizer is not None else ""


class _Job:
    def __init__(self, req: CompletionRequest, request_id: str, model: str, specs: list[ChoiceSpec],
                 prompt_ids: list[list[int]], echoes: list[str], force_usage: bool = False,
                 tokens_as_ids: bool = False, decode=None, prompt_logprobs: bool = False) -> None:
        self.req, self.id, self.model, self.created = req, request_id, model, now()
        self.prompt_ids, self.echoes = prompt_ids, echoes
        self.prompt_lengths = [len(ids) for ids in prompt_ids]
        self.force_usage = force_usage  # --enable-force-include-usage
        self.return_token_ids = bool(req.return_token_ids)  # vLLM's: token ids on the choices
        self.wants_prompt_logprobs = prompt_logprobs  # the choices carry vLLM's prompt_logprobs
        # echo + logprobs: the logprobs start with the echoed prompt's tokens (offsets from 0, as vLLM's)
        self.echo_logprobs = req.echo and req.logprobs is not None
        self.results = {s.index: ChoiceResult(index=s.index, prompt_index=s.prompt_index) for s in specs}
        self.prompt_logprobs: dict[int, object] = {}  # choice index -> its prompt's logprobs (engine entries)
        self.logprobs = {s.index: CompletionLogprobs(req.logprobs,
                                                     0 if self.echo_logprobs else len(echoes[s.prompt_index]),
                                                     tokens_as_ids, decode)
                         for s in specs} if req.logprobs is not None else None

    def _envelope(self, choices: list[dict]) -> dict:
        return {"id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
                "choices": choices}

    def _usage(self) -> dict:
        return usage(list(self.results.values()), self.prompt_lengths)

    def _delta_logprobs(self, spec: ChoiceSpec, delta) -> Optional[dict]:
        """The delta's logprobs in the completions format; the echoed prompt's first, on the delta that
        brings the prompt logprobs (the first)."""
        if delta.prompt_logprobs is not None:
            self.prompt_logprobs[spec.index] = delta.prompt_logprobs
        if self.logprobs is None:
            return None
        formatter = self.logprobs[spec.index]
        if not (self.echo_logprobs and delta.prompt_logprobs is not None):
            return formatter.format(delta.token_ids, delta.logprobs)
        return merge_completion_logprobs([formatter.format(self.prompt_ids[spec.prompt_index], delta.prompt_logprobs),
                                          formatter.format(delta.token_ids, delta.logprobs)])

    def _token_id_fields(self, result: ChoiceResult, token_ids: list[int], with_prompt: bool) -> dict:
        """return_token_ids: the choice's generated ids (a chunk's new ones), and its prompt's."""
        if not self.return_token_ids:
            return {}
        fields = {"prompt_token_ids": self.prompt_ids[result.prompt_index]} if with_prompt else {}
        fields["token_ids"] = list(token_ids)
        return fields

    async def full(self, streams: ChoiceStreams) -> dict:
        try:
            async with aclosing(streams.merged()) as merged:
                async for spec, delta in merged:
                    self.results[spec.index].add(delta)
                    lp = self._delta_logprobs(spec, delta)
                    if lp is not None:
                        self.results[spec.index].logprob_parts.append(lp)
        except Exception as exc:  # noqa: BLE001
            raise from_engine_error(exc) from exc
        finally:
            await streams.close()
        check_not_shut_down(streams, self.results.values())
        choices = []
        for index in sorted(self.results):
            r = self.results[index]
            choices.append({
                "index": index,
                "text": self.echoes[r.prompt_index] + r.text,
                "logprobs": merge_completion_logprobs(r.logprob_parts),
                "finish_reason": r.finish_reason,
                "stop_reason": stop_reason_json(r.stop_reason),
                # vLLM's fields, null unless asked for (as vLLM's choice has them: its tests read them)
                "prompt_logprobs": (prompt_logprobs_json(self.prompt_logprobs.get(index))
                                    if self.wants_prompt_logprobs else None),
                "prompt_token_ids": None, "token_ids": None,
                **self._token_id_fields(r, r.token_ids, with_prompt=True),
            })
        return {**self._envelope(choices), "usage": self._usage()}

    def _text_template(self, index: int, include_usage: bool) -> EventTemplate:
        chunk = self._envelope([{"index": index, "text": text_marker(), "logprobs": None, "finish_reason": None,
                                 "stop_reason": None}])
        if include_usage:
            chunk["usage"] = None
        return EventTemplate(chunk)

    async def stream(self, streams: ChoiceStreams) -> AsyncIterator[bytes]:
        include_usage, continuous = stream_usage(self.req.stream_options, self.force_usage)
        echoed: set[int] = set()
        announced: set[int] = set()  # return_token_ids: choices whose chunk carried the prompt's ids
        templates: dict[int, EventTemplate] = {}  # per choice: the text-only chunk, encoded once
        try:
            async with aclosing(streams.merged()) as merged:
                async for spec, delta in merged:
                    result = self.results[spec.index]
                    result.add(delta)
                    text = delta.text
                    if spec.index not in echoed:
                        echoed.add(spec.index)
                        text = self.echoes[spec.prompt_index] + text
                    lp = self._delta_logprobs(spec, delta)
                    if (not text and not delta.finished and not (lp and lp["tokens"])
                            and not (self.return_token_ids and delta.token_ids)):
                        continue  # tokens whose text is held back (partial characters, possible stop)
                    if lp is None and not delta.finished and not continuous and not self.return_token_ids:
                        # the per-token case
                        template = templates.get(spec.index)
                        if template is None:
                            template = templates[spec.index] = self._text_template(spec.index, include_usage)
                        yield template.fill(text)
                        continue
                    first_ids = spec.index not in announced
                    announced.add(spec.index)
                    chunk = self._envelope([{
                        "index": spec.index, "text": text, "logprobs": lp, "finish_reason": delta.finish_reason,
                        "stop_reason": stop_reason_json(delta.stop_reason),
                        **self._token_id_fields(result, delta.token_ids, with_prompt=first_ids)}])
                    if include_usage:
                        chunk["usage"] = self._usage() if continuous else None
                    yield event(chunk)
            if include_usage:
                yield event({**self._envelope([]), "usage": self._usage()})
        except Exception as exc:  # noqa: BLE001 - the headers are sent: report in-band
            yield event(stream_error_event(exc))
        finally:
            await streams.close()  # also when the client left before the first chunk
        yield DONE
