"""POST /v1/responses: OpenAI's Responses API, stateless, served by the chat route's machinery.

The body becomes a chat request (responses_protocol.py), which goes through the same chat
template, tool plan, structured-output constraint and sampling parameters as
/v1/chat/completions; admission, streaming and cancellation are the chat route's too
(``admit_and_respond``: a client that leaves aborts the engine request). Only the answer's shape
differs: a ``response`` object whose ``output`` holds a message and/or function_call items, and
its typed event stream (responses_events.py).
"""

from __future__ import annotations

import json
import logging
import math
import uuid
from contextlib import aclosing
from typing import AsyncIterator, Optional

import orjson
from quart import Response

from aioinfer.entrypoints.openai.errors import APIError, bad_request, from_engine_error
from aioinfer.entrypoints.openai.fanout import ChoiceSpec, ChoiceStreams
from aioinfer.entrypoints.openai.logprobs import chat_logprobs, check_logprobs_budget
from aioinfer.entrypoints.openai.responses_events import ResponseEvents
from aioinfer.entrypoints.openai.responses_items import ResponseItems
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
from aioinfer.entrypoints.openai.structured import structured_outputs_of, with_server_defaults
from aioinfer.entrypoints.openai.tool_calls import ToolPlan, tool_plan
from aioinfer.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


async def create_response(state: ServerState, body: bytes, client_id: Optional[str] = None) -> Response:
    req = parse_body(ResponsesRequest, body)
    req.check_supported()
    engine = engine_for(state, req)
    try:
        chat = to_chat_request(req)
        plan = tool_plan(chat, enforce_strict=state.config.enforce_strict_tools and structured_outputs_of(chat) is None)
        if plan is not None and plan.constraint is not None and chat.response_format is not None:
            raise bad_request("a required or named tool_choice constrains the output already; drop text.format",
                              param="tool_choice")
        params = chat_params(chat, state.model_defaults(), tool_constraint=plan.constraint if plan else None)
        with_server_defaults(params, state.config.disable_additional_properties)
        check_logprobs_cap(params, engine, sample_param="top_logprobs")
        prompt_ids = apply_chat_template(engine, chat.messages, tools=plan.tools if plan else None,
                                         chat_template=state.chat_template, **chat.template_options())
        check_logprobs_budget(params, [len(prompt_ids)], 1, engine, state.config.max_logprob_entries,
                              sample_param="top_logprobs", stream=bool(req.stream))
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
        # The request's tools and text format, echoed in every response object (the stream's first and last)
        fmt = req.format
        self.tools_json = _json_echo([tool.model_dump(exclude_none=True) for tool in req.tools or ()])
        self.text_json = _json_echo({"format": fmt.model_dump(by_alias=True, exclude_none=True) if fmt
                                     else {"type": "text"}})

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
        # With tools the text may hold calls: the message and the calls go out as items as the parser
        # lets them (responses_items.py); without, the message is opened at once and the text streams.
        items = ResponseItems(events, self.plan.parser(), self._message, lambda: _new_id("fc")) \
            if self.plan is not None else None
        try:
            for chunk in events.opening(self.response([], status="in_progress")):
                yield chunk  # the first also flushes the headers
            if items is None:
                for chunk in events.message_opened(0, self._message("", "in_progress")):
                    yield chunk
            async with aclosing(streams.merged()) as merged:
                async for _, delta in merged:
                    logprobs = self._add(delta)
                    if items is not None:
                        for chunk in items.feed(delta.text, logprobs):
                            yield chunk
                    elif delta.text or logprobs:
                        yield events.text_delta(0, self.message_id, delta.text, logprobs)
            if self.result.finish_reason == "abort":  # the server shut down, or an operator aborted it
                code = "shutting_down" if streams.shut_down else "aborted"
                yield events.error(APIError(503, "The response was aborted before it finished; retry it.",
                                            code=code))
                return
            status = self._item_status()
            if items is None:
                output = [self._message(self.result.text, status)]
                for chunk in events.message_closed(0, output[0]):
                    yield chunk
            else:
                for chunk in items.finish(status):
                    yield chunk
                output = items.output(status)
            yield events.closing(self.response(output))
        except Exception as exc:  # noqa: BLE001 - the headers are sent: report in-band
            yield events.error(from_engine_error(exc))
        finally:
            await streams.close()  # also when the client left before the first event

    # ------------------------------------------------------------------ the response object

    def _status(self) -> str:
        # "error": the output could not be kept to its constraint (structured_output/limits.py)
        return {"length": "incomplete", "abort": "cancelled", "error": "failed"}.get(self.result.finish_reason,
                                                                                  "completed")

    def _item_status(self) -> str:
        """A finished item's status: "incomplete" when max_output_tokens cut the response."""
        return "completed" if self.result.finish_reason == "stop" else "incomplete"

    def _output(self) -> list[dict]:
        """The finished response's output items: its message, and the function calls parsed out of the
        text (read as a stream would read it: the same items, in the order a stream sends them)."""
        status = self._item_status()
        if self.plan is None:
            return [self._message(self.result.text, status)]
        items = ResponseItems(ResponseEvents(), self.plan.parser(), self._message, lambda: _new_id("fc"))
        items.feed(self.result.text, None)
        items.finish(status)
        return items.output(status)

    def _message(self, text: str, status: str) -> dict:
        return {"type": "message", "id": self.message_id, "status": status, "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": [],
                             "logprobs": self.result.logprob_parts if status != "in_progress" else []}]}

    def response(self, output: list[dict], status: Optional[str] = None) -> dict:
        """The ``response`` object; ``status`` given: the one announced before any output."""
        req, final = self.req, status is None
        status = status or self._status()
        return {
            "id": self.id, "object": "response", "created_at": self.created, "status": status,
            "completed_at": now() if final and status == "completed" else None,
            "error": {"code": "server_error", "message": str(self.result.stop_reason)} if status == "failed" else None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "model": self.model, "output": output,
            "usage": self._usage() if final else None,
            # The request's settings echoed, as OpenAI does (the SDK's Response requires several).
            "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
            "parallel_tool_calls": req.parallel_tool_calls is not False,
            "temperature": self.params.temperature, "top_p": self.params.top_p,
            "tool_choice": _choice_json(req.tool_choice),
            "tools": self.tools_json,
            "text": self.text_json,
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


def _json_echo(value):
    """A request's own JSON (a tool's parameters, a schema) as the response echoes it. Those objects are
    free-form: an integer beyond 64 bits is valid JSON there, which orjson refuses, and would fail the
    response after generation; such a value is encoded by the standard library instead, its digits kept
    (NaN and infinities, which the parser lets into such objects, become null as orjson writes them)."""
    try:
        orjson.dumps(value)
        return value
    except orjson.JSONEncodeError:
        return orjson.Fragment(json.dumps(_finite(value), ensure_ascii=False).encode())


def _finite(value):
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_finite(item) for item in value]
    return value


def _choice_json(choice) -> object:
    if choice is None:
        return "auto"
    return choice if isinstance(choice, str) else choice.model_dump()


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"
