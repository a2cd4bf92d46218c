"""POST /v1/responses: OpenAI's Responses API, stateless, served by the chat route's machinery.

The body becomes a chat request (responses_protocol.py), which goes through the same chat
template, tool plan, structured-output constraint and sampling parameters as
/v1/chat/completions; admission, streaming and cancellation are the chat route's too
(``admit_and_respond``: a client that leaves aborts the engine request). Only the answer's shape
differs: a ``response`` object whose ``output`` holds a message and/or function_call items, and
its typed event stream (responses_events.py).
"""

from __future__ import annotations

import logging
import uuid
from contextlib import aclosing
from typing import AsyncIterator, Optional

from quart import Response

from aioinfer.entrypoints.openai.errors import APIError, bad_request, from_engine_error
from aioinfer.entrypoints.openai.fanout import ChoiceSpec, ChoiceStreams
from aioinfer.entrypoints.openai.logprobs import chat_logprobs
from aioinfer.entrypoints.openai.responses_events import ResponseEvents
from aioinfer.entrypoints.openai.responses_protocol import ResponsesRequest, responses_param, to_chat_request
from aioinfer.entrypoints.openai.sampling import chat_params, check_logprobs_cap, choice_params
from aioinfer.entrypoints.openai.server_state import ServerState
from aioinfer.entrypoints.openai.serving_chat import apply_chat_template
from aioinfer.entrypoints.openai.serving_common import (
    ChoiceResult,
    admit_and_respond,
    check_not_shut_down,
    engine_for,
    new_request_id,
    now,
    parse_body,
    tokens_as_ids,
    usage,
)
from aioinfer.entrypoints.openai.tool_call_parser import ToolCallParser
from aioinfer.entrypoints.openai.tool_calls import ToolPlan, tool_plan
from aioinfer.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


async def create_response(state: ServerState, body: bytes, client_id: Optional[str] = None) -> Response:
    req = parse_body(ResponsesRequest, body)
    req.check_supported()
    engine = engine_for(state, req)
    try:
        chat = to_chat_request(req)
        plan = tool_plan(chat)
        if plan is not None and plan.constraint is not None and chat.response_format is not None:
            raise bad_request("a required or named tool_choice constrains the output already; drop text.format",
                              param="tool_choice")
        params = chat_params(chat, state.model_defaults(), tool_constraint=plan.constraint if plan else None)
        check_logprobs_cap(params, engine, sample_param="top_logprobs")
        prompt_ids = apply_chat_template(engine, chat.messages, tools=plan.tools if plan else None,
                                         chat_template=state.chat_template, **chat.template_options())
    except APIError as exc:
        raise responses_param(exc) from None

    # OpenAI's ids are resp_/msg_/fc_ + hex; a well-formed X-Request-Id is kept inside, as on the other routes.
    response_id = "resp_" + new_request_id("resp", client_id).removeprefix("resp-")
    spec = ChoiceSpec(index=0, prompt_index=0, prompt=prompt_ids, params=choice_params(params, 0))
    job = _ResponseJob(req, response_id, state.served_model_name, params, len(prompt_ids), plan,
                       tokens_as_ids=tokens_as_ids(req, state))
    return await admit_and_respond(engine, [spec], response_id, req, job)


class _ResponseJob:
    """One response: accumulated from the engine's deltas, answered whole or as events."""

    def __init__(self, req: ResponsesRequest, response_id: str, model: str, params: SamplingParams,
                 prompt_length: int, plan: Optional[ToolPlan], tokens_as_ids: bool = False) -> None:
        self.req, self.id, self.model, self.params = req, response_id, model, params
        self.created = now()
        self.prompt_length = prompt_length
        self.plan = plan if plan is not None and plan.parses else None  # None: the text is the answer
        self.tokens_as_ids = tokens_as_ids
        self.result = ChoiceResult(index=0, prompt_index=0)
        self.message_id = _new_id("msg")

    def _add(self, delta) -> Optional[list]:
        """Fold a delta in; its logprobs in OpenAI's form when they were asked for."""
        self.result.add(delta)
        if not self.req.wants_logprobs:
            return None
        parts = chat_logprobs(delta.token_ids, delta.logprobs, self.req.top_logprobs or 0,
                              self.tokens_as_ids)["content"]
        self.result.logprob_parts.extend(parts)
        return parts

    async def full(self, streams: ChoiceStreams) -> dict:
        try:
            async with aclosing(streams.merged()) as merged:
                async for _, delta in merged:
                    self._add(delta)
        except Exception as exc:  # noqa: BLE001
            raise from_engine_error(exc) from exc
        finally:
            await streams.close()
        check_not_shut_down(streams, [self.result])
        return self.response(self._output())

    async def stream(self, streams: ChoiceStreams) -> AsyncIterator[bytes]:
        events = ResponseEvents()
        # With tools the text may hold calls: content goes out as it is certain (tool_call_parser.py),
        # the message opened at its first piece; the calls are sent as items when the response ends.
        parser = self.plan.parser() if self.plan is not None else None
        opened = parser is None
        unsent_logprobs: list = []  # of tokens whose text is held back: sent with the next piece
        try:
            for chunk in events.opening(self.response([], status="in_progress")):
                yield chunk  # the first also flushes the headers
            if opened:
                for chunk in events.message_opened(0, self._message("", "in_progress")):
                    yield chunk
            async with aclosing(streams.merged()) as merged:
                async for _, delta in merged:
                    logprobs = self._add(delta)
                    if parser is None:
                        if delta.text or logprobs:
                            yield events.text_delta(0, self.message_id, delta.text, logprobs)
                        continue
                    text = parser.feed(delta.text)[0] if delta.text else ""
                    unsent_logprobs += logprobs or ()
                    if text:
                        if not opened:
                            opened = True
                            for chunk in events.message_opened(0, self._message("", "in_progress")):
                                yield chunk
                        yield events.text_delta(0, self.message_id, text, unsent_logprobs)
                        unsent_logprobs = []
            if self.result.finish_reason == "abort":  # the server shut down, or an operator aborted it
                code = "shutting_down" if streams.shut_down else "aborted"
                yield events.error(APIError(503, "The response was aborted before it finished; retry it.",
                                            code=code))
                return
            rest = parser.finish()[0] if parser is not None else ""
            output = self._output(parser)
            if opened:  # the message is the first item (its content began with what was sent)
                if rest:
                    yield events.text_delta(0, self.message_id, rest, unsent_logprobs)
                for chunk in events.message_closed(0, output[0]):
                    yield chunk
            for index in range(1 if opened else 0, len(output)):
                for chunk in events.item(index, output[index]):
                    yield chunk
            yield events.closing(self.response(output))
        except Exception as exc:  # noqa: BLE001 - the headers are sent: report in-band
            yield events.error(from_engine_error(exc))
        finally:
            await streams.close()  # also when the client left before the first event

    # ------------------------------------------------------------------ the response object

    def _status(self) -> str:
        return {"length": "incomplete", "abort": "cancelled"}.get(self.result.finish_reason, "completed")

    def _output(self, parser: Optional[ToolCallParser] = None) -> list[dict]:
        """The finished response's output items: its message, and the function calls parsed out of the
        text (by ``parser``, finished, when the text was streamed through one)."""
        status = "completed" if self.result.finish_reason == "stop" else "incomplete"
        if self.plan is None:
            return [self._message(self.result.text, status)]
        content, calls = (parser.content, parser.calls) if parser is not None else self.plan.parse(self.result.text)
        items = [self._message(content or "", status)] if content or not calls else []
        items.extend({"type": "function_call", "id": _new_id("fc"), "call_id": call["id"],
                      "name": call["function"]["name"], "arguments": call["function"]["arguments"],
                      "status": status} for call in calls)
        return items

    def _message(self, text: str, status: str) -> dict:
        return {"type": "message", "id": self.message_id, "status": status, "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": [],
                             "logprobs": self.result.logprob_parts if status != "in_progress" else []}]}

    def response(self, output: list[dict], status: Optional[str] = None) -> dict:
        """The ``response`` object; ``status`` given: the one announced before any output."""
        req, final = self.req, status is None
        status = status or self._status()
        fmt = req.format
        return {
            "id": self.id, "object": "response", "created_at": self.created, "status": status,
            "completed_at": now() if final and status == "completed" else None,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "model": self.model, "output": output,
            "usage": self._usage() if final else None,
            # The request's settings echoed, as OpenAI does (the SDK's Response requires several).
            "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
            "parallel_tool_calls": req.parallel_tool_calls is not False,
            "temperature": self.params.temperature, "top_p": self.params.top_p,
            "tool_choice": _choice_json(req.tool_choice),
            "tools": [tool.model_dump(exclude_none=True) for tool in req.tools or ()],
            "text": {"format": fmt.model_dump(by_alias=True, exclude_none=True) if fmt else {"type": "text"}},
            "top_logprobs": req.top_logprobs or 0, "truncation": req.truncation or "disabled",
            "metadata": req.metadata or {}, "user": req.user,
            "store": False, "background": False, "previous_response_id": None, "reasoning": None,
        }

    def _usage(self) -> dict:
        counts = usage([self.result], [self.prompt_length])
        return {"input_tokens": counts["prompt_tokens"],
                "input_tokens_details": {"cached_tokens": counts["prompt_tokens_details"]["cached_tokens"],
                                         "cache_write_tokens": 0},
                "output_tokens": counts["completion_tokens"],
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": counts["total_tokens"]}


def _choice_json(choice) -> object:
    if choice is None:
        return "auto"
    return choice if isinstance(choice, str) else choice.model_dump()


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"
