"""POST /v1/chat/completions: messages -> chat template -> n choices, streamed or not."""

from __future__ import annotations

from contextlib import aclosing
from typing import AsyncIterator, Optional

from quart import Response

from aioinfer.entrypoints.openai.errors import bad_request, from_engine_error
from aioinfer.entrypoints.openai.fanout import ChoiceSpec, ChoiceStreams
from aioinfer.entrypoints.openai.logprobs import chat_logprobs, check_logprobs_budget, prompt_logprobs_json
from aioinfer.entrypoints.openai.protocol import ChatCompletionRequest, ChatMessage
from aioinfer.entrypoints.openai.sampling import chat_params, check_logprobs_cap, choice_params
from aioinfer.entrypoints.openai.server_state import ServerState
from aioinfer.entrypoints.openai.structured import structured_outputs_of, with_server_defaults
from aioinfer.entrypoints.chat_tools import render_with_tools
from aioinfer.entrypoints.openai.tool_call_parser import ToolCallParser
from aioinfer.entrypoints.openai.tool_calls import ToolPlan, tool_plan
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


async def create_chat_completion(state: ServerState, body: bytes, client_id: Optional[str] = None) -> Response:
    req = parse_body(ChatCompletionRequest, body)
    engine = engine_for(state, req)
    plan = tool_plan(req, enforce_strict=state.config.enforce_strict_tools and structured_outputs_of(req) is None)
    base = chat_params(req, state.model_defaults(), tool_constraint=plan.constraint if plan else None)
    with_server_defaults(base, state.config.disable_additional_properties)
    check_logprobs_cap(base, engine, sample_param="top_logprobs")
    try:
        options = req.template_options()
    except ValueError as exc:
        raise bad_request(str(exc), param="continue_final_message") from None
    prompt_ids = apply_chat_template(engine, req.messages, tools=plan.tools if plan else None,
                                     chat_template=state.chat_template, **options)
    check_logprobs_budget(base, [len(prompt_ids)], req.n, engine, state.config.max_logprob_entries,
                          sample_param="top_logprobs", stream=bool(req.stream))

    request_id = new_request_id("chatcmpl", client_id)
    specs = [ChoiceSpec(index=i, prompt_index=0, prompt=prompt_ids, params=choice_params(base, i))
             for i in range(req.n)]
    job = _Job(req, request_id, state.served_model_name, specs, prompt_ids, plan,
               force_usage=state.config.enable_force_include_usage,
               tokens_as_ids=tokens_as_ids(req, state))
    return await admit_and_respond(engine, specs, request_id, req, job)


def apply_chat_template(engine, messages: list[ChatMessage], add_generation_prompt: bool = True,
                        tools: Optional[list[dict]] = None, chat_template: Optional[str] = None,
                        add_special_tokens: bool = False, **template_kwargs) -> list[int]:
    """The offline ``LLM.chat`` recipe: render the template, then tokenize without adding special tokens
    (``add_special_tokens``: the tokenizer's on top of the template's, vLLM's option on /tokenize).
    ``tools`` go through the template; one that ignores them gets them as a system message (chat_tools.py).
    ``chat_template``: the server's --chat-template, instead of the tokenizer's."""
    tokenizer = engine.tokenizer
    if tokenizer is None or not (chat_template or getattr(tokenizer, "chat_template", None)):
        raise bad_request("this model has no chat template; use /v1/completions", param="messages")
    conversation = [m.for_template() for m in messages]

    try:
        text = render_with_tools(tokenizer, conversation, tools, add_generation_prompt=add_generation_prompt,
                                 chat_template=chat_template, **template_kwargs)
    except Exception as exc:  # noqa: BLE001 - jinja errors ("roles must alternate") are the user's input
        raise bad_request(f"the chat template rejected the messages: {exc}", param="messages") from None
    ids = list(tokenizer.encode(text, add_special_tokens=add_special_tokens))
    if not ids:
        raise bad_request("the rendered conversation is empty", param="messages")
    return ids


class _Job:
    def __init__(self, req: ChatCompletionRequest, request_id: str, model: str, specs: list[ChoiceSpec],
                 prompt_ids: list[int], plan: Optional[ToolPlan] = None, force_usage: bool = False,
                 tokens_as_ids: bool = False) -> None:
        self.req, self.id, self.model, self.created = req, request_id, model, now()
        self.plan = plan if plan is not None and plan.parses else None  # None: the text is the answer
        self.prompt_ids = prompt_ids
        self.prompt_length = len(prompt_ids)
        self.return_token_ids = bool(req.return_token_ids)  # vLLM's: ids on the choices and the response
        self.prompt_logprobs = None  # the prompt's logprobs (engine entries), from the first choice with them
        self.force_usage = force_usage  # --enable-force-include-usage
        self.tokens_as_ids = tokens_as_ids  # return_tokens_as_token_ids
        self.echo = req.echoed_text()
        self.top_n = req.top_logprobs or 0  # -1: the whole vocabulary
        self.results = {s.index: ChoiceResult(index=s.index, prompt_index=0) for s in specs}

    def _envelope(self, obj: str, choices: list[dict]) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices}

    def _usage(self) -> dict:
        return usage(list(self.results.values()), [self.prompt_length])

    def _logprobs(self, delta) -> Optional[dict]:
        return (chat_logprobs(delta.token_ids, delta.logprobs, self.top_n, self.tokens_as_ids)
                if self.req.logprobs else None)

    async def full(self, streams: ChoiceStreams) -> dict:
        try:
            async with aclosing(streams.merged()) as merged:
                async for spec, delta in merged:
                    result = self.results[spec.index]
                    result.add(delta)
                    if self.prompt_logprobs is None:
                        self.prompt_logprobs = delta.prompt_logprobs  # every choice scores the same prompt
                    lp = self._logprobs(delta)
                    if lp is not None:
                        result.logprob_parts.extend(lp["content"])
        except Exception as exc:  # noqa: BLE001
            raise from_engine_error(exc) from exc
        finally:
            await streams.close()
        check_not_shut_down(streams, self.results.values())
        choices = []
        for index in sorted(self.results):
            r = self.results[index]
            message, finish_reason = self._message(r)
            choices.append({
                "index": index,
                "message": message,
                "logprobs": {"content": r.logprob_parts} if self.req.logprobs else None,
                "finish_reason": finish_reason,
                "stop_reason": stop_reason_json(r.stop_reason),
                "token_ids": r.token_ids if self.return_token_ids else None,
            })
        # vLLM's fields, null unless asked for (as vLLM's response has them: its tests read them);
        # prompt_logprobs on the response, the prompt being every choice's
        return {**self._envelope("chat.completion", choices), "usage": self._usage(),
                "prompt_logprobs": prompt_logprobs_json(self.prompt_logprobs),
                "prompt_token_ids": self.prompt_ids if self.return_token_ids else None}

    def _message(self, result) -> tuple[dict, Optional[str]]:
        """A finished choice's message and finish_reason (tool calls parsed out of its text)."""
        if self.plan is None:
            return {"role": "assistant", "content": self.echo + result.text}, result.finish_reason
        content, calls = self.plan.parse(result.text)
        if content is None and self.plan.mode in ("named", "required"):
            content = ""  # vLLM's for a constrained choice's message (its tests take len() of it)
        if self.echo:
            content = self.echo + (content or "")
        if not calls:
            return {"role": "assistant", "content": content}, result.finish_reason
        finish = _call_finish(self.plan.mode, result.finish_reason)
        return {"role": "assistant", "content": content, "tool_calls": calls}, finish

    def _text_chunk(self, kind: str, index: int, include_usage: bool) -> dict:
        obj = self._envelope(kind, [{"index": index, "delta": {"content": text_marker()}, "logprobs": None,
                                     "finish_reason": None, "stop_reason": None}])
        if include_usage:
            obj["usage"] = None
        return obj

    @staticmethod
    def _tool_pieces(parser: ToolCallParser, delta) -> tuple[str, list[dict], Optional[str]]:
        """Beside tools: (content, tool-call items, finish_reason) of a delta, as far as they are
        certain (tool_call_parser.py)."""
        content, calls = parser.feed(delta.text) if delta.text else ("", [])
        if not delta.finished:
            return content, calls, None
        rest, more = parser.finish()
        finish_reason = _call_finish(parser.mode, delta.finish_reason) if parser.calls else delta.finish_reason
        return content + rest, calls + more, finish_reason

    async def stream(self, streams: ChoiceStreams) -> AsyncIterator[bytes]:
        include_usage, continuous = stream_usage(self.req.stream_options, self.force_usage)
        kind = "chat.completion.chunk"
        templates: dict[int, EventTemplate] = {}  # per choice: the content-only chunk, encoded once

        prompt_ids_sent = not self.return_token_ids

        def chunk(choice: dict) -> bytes:
            nonlocal prompt_ids_sent
            obj = self._envelope(kind, [choice])
            if not prompt_ids_sent:  # return_token_ids: on the stream's first chunk only (vLLM's)
                obj["prompt_token_ids"] = self.prompt_ids
                prompt_ids_sent = True
            if include_usage:
                obj["usage"] = self._usage() if continuous else None
            return event(obj)

        try:
            # The role comes first, before any token, as OpenAI does; it also flushes the headers.
            for index in sorted(self.results):
                yield chunk({"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                             "finish_reason": None})
            parsers = None if self.plan is None else {index: self.plan.parser() for index in self.results}
            if self.echo:
                for index in sorted(self.results):
                    yield chunk({"index": index, "delta": {"content": self.echo}, "logprobs": None,
                                 "finish_reason": None})
            async with aclosing(streams.merged()) as merged:
                async for spec, delta in merged:
                    self.results[spec.index].add(delta)
                    lp = self._logprobs(delta)
                    text, calls, finish_reason = delta.text, None, delta.finish_reason
                    if parsers is not None:  # tools: the text may hold calls (sent as far as certain)
                        text, calls, finish_reason = self._tool_pieces(parsers[spec.index], delta)
                    if (not text and not calls and not delta.finished and not (lp and lp["content"])
                            and not (self.return_token_ids and delta.token_ids)):
                        continue  # tokens whose text is held back (partial characters, possible stop or call)
                    if lp is None and not calls and not delta.finished and not continuous and not self.return_token_ids:
                        # the per-token case
                        template = templates.get(spec.index)
                        if template is None:
                            template = templates[spec.index] = EventTemplate(self._text_chunk(
                                kind, spec.index, include_usage))
                        yield template.fill(text)
                        continue
                    message = {"content": text} if text else {}
                    if calls:
                        message["tool_calls"] = calls
                    choice = {"index": spec.index, "delta": message, "logprobs": lp, "finish_reason": finish_reason,
                              "stop_reason": stop_reason_json(delta.stop_reason)}
                    if self.return_token_ids:
                        choice["token_ids"] = list(delta.token_ids)
                    yield chunk(choice)
            if include_usage:
                yield event({**self._envelope(kind, []), "usage": self._usage()})
        except Exception as exc:  # noqa: BLE001 - the headers are sent: report in-band
            yield event(stream_error_event(exc))
        finally:
            await streams.close()  # also when the client left before the first chunk
        yield DONE


def _call_finish(mode: str, finish_reason: Optional[str]) -> Optional[str]:
    """A choice that called tools and ended by itself: "tool_calls", except for a named function,
    whose choice ends "stop" as on OpenAI's API (and vLLM's, streamed or not); cut or failed: as is."""
    return "tool_calls" if finish_reason == "stop" and mode != "named" else finish_reason
