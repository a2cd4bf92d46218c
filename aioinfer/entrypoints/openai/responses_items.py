"""A Responses stream's output items beside tools: the message and the function calls, as they become certain.

The choice's text goes through the tool-call parser (tool_call_parser.py), which says what is
content and what is a call as soon as it can. Each becomes an output item the moment its first
piece is certain, as OpenAI streams them: a function call is opened when the parser sends its name
(a named function's arguments then follow as they are written; a call under "auto" or "required"
comes whole and is closed at once), the message when its first content arrives. Items are never
interleaved: a call the parser finishes while the message is still open is sent after the message,
and content after calls (rare: text after a ``</tool_call>``) becomes a message after them. The
finished response lists the items in the order they were opened, and the unstreamed route reads
the whole text through the same class, so both give the same items.

A call that came whole (a ``</tool_call>`` block, an object of a "required" list, a bare call) is
``completed`` even when max_output_tokens cut the response after it; a named function's arguments,
and the message, take the response's status.
"""

from __future__ import annotations

from typing import Callable, Optional, Union

from aioinfer.entrypoints.openai.responses_events import ResponseEvents
from aioinfer.entrypoints.openai.tool_call_parser import ToolCallParser

MESSAGE = "message"


class ResponseItems:
    def __init__(self, events: ResponseEvents, parser: ToolCallParser, message: Callable[[str, str], dict],
                 new_call_id: Callable[[], str]) -> None:
        self.events, self.parser = events, parser
        self._message = message  # (text, status) -> the message item
        self._new_call_id = new_call_id
        self.order: list[Union[str, int]] = []  # MESSAGE or a call's index (the parser's), as opened
        self._calls: dict[int, dict] = {}  # a call's index -> its function_call item (arguments so far)
        self._message_open = False
        self._open_call: Optional[int] = None  # a call whose arguments may still grow (a named function's)
        self._unsent_logprobs: list = []  # of tokens whose text is held back: sent with the next content
        self._message_id: Optional[str] = None

    def feed(self, text: str, logprobs: Optional[list]) -> list[bytes]:
        """The events a delta's text (and its tokens' logprobs) lets go now."""
        content, pieces = self.parser.feed(text) if text else ("", [])
        self._unsent_logprobs += logprobs or ()
        out = []
        if content:  # first: what a piece of text adds as content comes before any call it completes
            out += self._open_message()
            out.append(self.events.text_delta(self._index(MESSAGE), self._message_id, content, self._unsent_logprobs))
            self._unsent_logprobs = []
        if not self._message_open:  # calls after an open message wait for it to close
            out += self._pieces(pieces)
        return out

    def finish(self, status: str) -> list[bytes]:
        """The rest, once the text is complete (``status``: the message's, "completed" or "incomplete")."""
        rest, pieces = self.parser.finish()
        out = []
        if self._message_open:
            if rest:
                out.append(self.events.text_delta(self._index(MESSAGE), self._message_id, rest, self._unsent_logprobs))
            out += self.events.message_closed(self._index(MESSAGE), self._message(self.parser.content or "", status))
            self._message_open = False
        else:
            out += self._pieces(pieces)
        out += self._close_call(status)  # a named function's arguments: cut if the response was
        for index, call in enumerate(self.parser.calls):  # calls that waited for the message to close
            if index not in self._calls:  # whole (a named function's never waits: it has no message)
                self._calls[index] = self._item(call, "completed")
                self.order.append(index)
                out += self.events.function_call(self._index(index), self._calls[index])
        if MESSAGE not in self.order and (self.parser.content or not self.parser.calls):
            self.order.append(MESSAGE)
            out += self.events.message(self._index(MESSAGE), self._message(self.parser.content or "", status))
        return out

    def output(self, status: str) -> list[dict]:
        """The finished response's output items, in the order they were sent."""
        return [self._message(self.parser.content or "", status) if key == MESSAGE else self._calls[key]
                for key in self.order]

    # ------------------------------------------------------------------------------------------

    def _index(self, key: Union[str, int]) -> int:
        return self.order.index(key)

    def _open_message(self) -> list[bytes]:
        if self._message_open:
            return []
        out = self._close_call("completed")
        self._message_open = True
        self.order.append(MESSAGE)
        item = self._message("", "in_progress")
        self._message_id = item["id"]
        return out + self.events.message_opened(self._index(MESSAGE), item)

    def _pieces(self, pieces: list[dict]) -> list[bytes]:
        """Calls' pieces in the chunk form (tool_call_parser.py): a first one with the id and name,
        then argument fragments (a named function's only)."""
        out = []
        for piece in pieces:
            index, fragment = piece["index"], piece["function"].get("arguments", "")
            if index not in self._calls:
                out += self._close_call("completed")
                item = self._item(self.parser.calls[index], "in_progress")
                item["arguments"] = ""
                self._calls[index], self._open_call = item, index
                self.order.append(index)
                out.append(self.events.function_call_opened(self._index(index), item))
            item = self._calls[index]
            if fragment:
                item["arguments"] += fragment
                out.append(self.events.arguments_delta(self._index(index), item["id"], fragment))
            if self.parser.mode != "named":  # the call came whole
                out += self._close_call("completed")
        return out

    def _close_call(self, status: str) -> list[bytes]:
        index, self._open_call = self._open_call, None
        if index is None:
            return []
        item = self._calls[index]
        item["arguments"], item["status"] = self.parser.calls[index]["function"]["arguments"], status
        return self.events.function_call_closed(self._index(index), item)

    def _item(self, call: dict, status: str) -> dict:
        return {"type": "function_call", "id": self._new_call_id(), "call_id": call["id"],
                "name": call["function"]["name"], "arguments": call["function"]["arguments"], "status": status}
