"""The Responses API's stream: typed server-sent events, numbered, in OpenAI's order.

Each event is ``event: <type>`` + ``data: {..., "type", "sequence_number"}`` (the openai client
reads the data, whose ``type`` it dispatches on; the event line is OpenAI's framing, kept for
clients that route on it). The order, per output item:

    response.created, response.in_progress
    response.output_item.added                         (a message, or a function_call)
      message:  response.content_part.added, response.output_text.delta x N,
                response.output_text.done, response.content_part.done
      function_call: response.function_call_arguments.delta, ...arguments.done
    response.output_item.done
    response.completed  (response.incomplete when max_output_tokens cut it; response.failed, with
                         the response's ``error``, when the output could not be kept to its constraint)

An error once the stream has begun is one ``error`` event (``code``, ``message``, ``param``), and
the stream ends: OpenAI's form, which the openai client yields as a ``ResponseErrorEvent`` and
openai-agents raises on. No ``data: [DONE]``: OpenAI sends none on this route.
"""

from __future__ import annotations

from typing import Optional

from aioinfer.entrypoints.openai.errors import APIError
from aioinfer.entrypoints.openai.sse import dumps

TERMINAL = {"completed": "response.completed", "incomplete": "response.incomplete", "failed": "response.failed"}


class ResponseEvents:
    """Numbers and frames one response's events (``sequence_number`` counts from 0)."""

    def __init__(self) -> None:
        self._next = 0

    def event(self, kind: str, **fields) -> bytes:
        body = {"type": kind, "sequence_number": self._next, **fields}
        self._next += 1
        return b"event: " + kind.encode() + b"\ndata: " + dumps(body) + b"\n\n"

    def opening(self, response: dict) -> list[bytes]:
        return [self.event("response.created", response=response),
                self.event("response.in_progress", response=response)]

    def message_opened(self, index: int, item: dict) -> list[bytes]:
        """The message item and its one output_text part, still empty."""
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        return [self.event("response.output_item.added", output_index=index, item={**item, "content": []}),
                self.event("response.content_part.added", item_id=item["id"], output_index=index, content_index=0,
                           part=part)]

    def text_delta(self, index: int, item_id: str, delta: str, logprobs: Optional[list] = None) -> bytes:
        return self.event("response.output_text.delta", item_id=item_id, output_index=index, content_index=0,
                          delta=delta, logprobs=logprobs or [])

    def message_closed(self, index: int, item: dict) -> list[bytes]:
        """``item``: the finished message, its one part holding the whole text."""
        part = item["content"][0]
        return [self.event("response.output_text.done", item_id=item["id"], output_index=index, content_index=0,
                           text=part["text"], logprobs=part["logprobs"]),
                self.event("response.content_part.done", item_id=item["id"], output_index=index, content_index=0,
                           part=part),
                self.event("response.output_item.done", output_index=index, item=item)]

    def message(self, index: int, item: dict) -> list[bytes]:
        """A message known whole at once (with tools: content after the calls, or an empty reply)."""
        part = item["content"][0]
        return [*self.message_opened(index, item), self.text_delta(index, item["id"], part["text"], part["logprobs"]),
                *self.message_closed(index, item)]

    def function_call_opened(self, index: int, item: dict) -> bytes:
        """A function_call item, its arguments still to come."""
        return self.event("response.output_item.added", output_index=index,
                          item={**item, "arguments": "", "status": "in_progress"})

    def arguments_delta(self, index: int, item_id: str, delta: str) -> bytes:
        return self.event("response.function_call_arguments.delta", item_id=item_id, output_index=index, delta=delta)

    def function_call_closed(self, index: int, item: dict) -> list[bytes]:
        """``item``: the finished function_call, its whole arguments."""
        return [self.event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                           name=item["name"], arguments=item["arguments"]),
                self.event("response.output_item.done", output_index=index, item=item)]

    def function_call(self, index: int, item: dict) -> list[bytes]:
        """A function_call known whole at once."""
        return [self.function_call_opened(index, item), self.arguments_delta(index, item["id"], item["arguments"]),
                *self.function_call_closed(index, item)]

    def closing(self, response: dict) -> bytes:
        """``response.completed``, ``response.incomplete`` or ``response.failed``, with the whole response."""
        return self.event(TERMINAL.get(response["status"], "response.completed"), response=response)

    def error(self, exc: APIError) -> bytes:
        return self.event("error", code=exc.code, message=exc.message, param=exc.param)
