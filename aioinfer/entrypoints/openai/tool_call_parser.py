"""A choice's text read as tool calls, as it streams: what may go to the client now, what waits.

One parser per choice (``ToolPlan.parser()``); ``feed`` takes each new piece of text and returns what
is certain already (content, and ``delta.tool_calls`` items in the chunk form), ``finish`` the rest.
The whole message (``content``, ``calls``) is what the pieces add up to, so a streamed choice and
the same choice not streamed say the same (the non-stream route feeds the whole text at once).

- "auto": text is content as it comes, except what could still turn out to be a call: a trailing
  piece that may be the start of ``<tool_call>``, trailing whitespace (a call after it would drop
  it), and a reply that so far could be a bare call (it starts with ``{``, ``[`` or a markdown fence
  of JSON: Qwen2.5-Coder-0.5B writes calls so), which waits for its end. From the first
  ``<tool_call>`` on, the text is calls: each block is sent as a call once its ``</tool_call>`` is
  written (a block that does not parse as a call to a given tool is not one); text around and after
  the blocks is content at the end. With ``parallel_tool_calls: false`` only the first call is one
  (vLLM's rule: the model is not stopped, the calls after it are dropped). This is how OpenAI and vLLM stream a reply beside tools: an
  agent's final answer is not held back until it is complete.
- a named function: the text is the call's arguments; its id and name go first, then the arguments
  as they are written.
- "required": the text is a JSON list of ``{"name", "parameters"}``; each call is sent once its
  object is complete. A list cut by ``max_tokens`` keeps its complete calls, and the call it was
  writing when its name is complete, with the arguments written so far (as OpenAI answers a named
  choice cut so: ``finish_reason: "length"``, the partial call; a client's parser reports it as an
  invalid call). The text is never content: what a client would take for an answer there is the
  list's JSON (vLLM's tests expect ``content`` empty, tool_calls absent, when not even a name was
  written).

Calls without tags are also Llama 3.x's JSON format (vLLM's ``llama3_json``): a reply that is,
after an optional ``<|python_tag|>``, one or more ``{"name": ..., "parameters": {...}}`` objects
separated by ``;`` or whitespace. The whole reply, as for the other bare forms: JSON inside prose
stays prose (vLLM's parser takes an envelope out of prose too; here a streamed reply and the same
reply whole must agree, and prose before it has been sent as content by then).
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Optional

TAG, END_TAG = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"  # Llama 3.x's, before a call (a special token: in the text unless skipped)
_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)


def new_call(name: str, arguments: str) -> dict:
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": name, "arguments": arguments}}


class ToolCallParser:
    def __init__(self, mode: str, names: set[str], named: Optional[str] = None,
                 max_calls: Optional[int] = None) -> None:
        self.mode, self.names, self.named = mode, names, named
        self.max_calls = max_calls  # ``parallel_tool_calls: false``: 1 (auto keeps the first call, as vLLM)
        self.text = ""
        self.content: Optional[str] = None  # the message's, once ``finish`` has run
        self.calls: list[dict] = []  # sent so far; the message's, once ``finish`` has run
        self._sent = 0  # auto: text[:_sent] sent as content; named: chars of the arguments sent
        self._maybe_bare = True  # auto: the reply so far could be a call without tags
        self._lead = -1  # auto: where the reply's first non-whitespace character is
        self._first_tag = -1  # auto: where the first <tool_call> starts
        self._blocks_from = 0  # auto: where the next complete block is looked for
        self._start = -1  # named: where the arguments begin (their first non-whitespace character)
        self._scan = _ListScan()  # required

    def feed(self, text: str) -> tuple[str, list[dict]]:
        """(content, tool-call items) that ``text`` adds and that can be sent now."""
        self.text += text
        if self.mode == "named":
            return "", self._named_fragment(final=False)
        if self.mode == "required":
            return "", self._complete_items()
        return self._auto_feed(len(self.text) - len(text))

    def finish(self) -> tuple[str, list[dict]]:
        """The rest, once the text is complete; ``content`` and ``calls`` are then the message's."""
        if self.mode == "named":
            items = self._named_fragment(final=True)
            return "", items
        if self.mode == "required":
            return "", self._complete_items() + self._add(self._partial_call())
        return self._auto_finish()

    # ----------------------------------------------------------------------------- auto

    def _auto_feed(self, old_length: int) -> tuple[str, list[dict]]:
        text = self.text
        if self._maybe_bare:
            if self._lead < 0 and text.strip():
                self._lead = len(text) - len(text.lstrip())
            # Its first characters decide (read alone: a long reply is not copied at every token).
            if self._lead < 0 or _could_be_bare_call(text[self._lead:self._lead + 64]):
                return "", []
            self._maybe_bare = False
            old_length = 0  # the text held so far is read now
        content = ""
        if self._first_tag < 0:
            found = text.find(TAG, max(0, old_length - len(TAG) + 1))
            if found >= 0:
                self._first_tag = self._blocks_from = found
                safe = found
            else:
                safe = len(text) - _partial_suffix(text, TAG)
            safe = _before_trailing_space(text, safe, self._sent)
            if safe > self._sent:
                content, self._sent = text[self._sent:safe], safe
        items = []
        if self._first_tag >= 0 and END_TAG in text[max(self._blocks_from, old_length - len(END_TAG) + 1):]:
            for match in _CALL.finditer(text, self._blocks_from):
                if not match.group(0).endswith(END_TAG):
                    break  # written up to here so far
                self._blocks_from = match.end()
                items += self._add(self._calls_in(match.group(1)))
        return content, items

    def _auto_finish(self) -> tuple[str, list[dict]]:
        text = self.text
        calls = [call for match in _CALL.finditer(text) for call in self._calls_in(match.group(1))]
        if calls:
            content = _CALL.sub("", text).rstrip()
            content = content if content.strip() else None
        else:
            # Small models write the call's JSON bare, without the tags (Qwen2.5-Coder-0.5B does),
            # or inside a markdown code fence: a whole reply that is a call (or a list of them) is one.
            calls = self._calls_in(_FENCE.sub(r"\1", text.strip()))
            content = None if calls else text
        calls = calls[:self.max_calls]
        sent = text[:self._sent]
        assert (content or "").startswith(sent), "content was sent that the message does not have"
        # The blocks sent already are the first calls found again: they keep their ids.
        assert [c["function"] for c in calls[:len(self.calls)]] == [c["function"] for c in self.calls]
        items = self._add(calls[len(self.calls):])
        self.content = content
        return (content or "")[len(sent):], items

    def _calls_in(self, text: str) -> list[dict]:
        """The calls a JSON text holds: ``{"name", "arguments" | "parameters"}`` objects, lists of them,
        several separated by ``;`` or whitespace (Llama 3.x), after an optional ``<|python_tag|>``;
        [] if it is anything else."""
        values = _json_values(text.removeprefix(PYTHON_TAG))
        if not values:
            return []
        calls = []
        for item in (item for value in values for item in (value if isinstance(value, list) else [value])):
            if not isinstance(item, dict) or item.get("name") not in self.names:
                return []  # not a call after all: it stays content
            arguments = item.get("arguments", item.get("parameters", {}))
            if not isinstance(arguments, dict):
                return []
            calls.append(new_call(item["name"], json.dumps(arguments, ensure_ascii=False)))
        return calls

    def _add(self, calls: list[dict]) -> list[dict]:
        if self.max_calls is not None:
            calls = calls[:max(0, self.max_calls - len(self.calls))]
        items = [{"index": len(self.calls) + i, **call} for i, call in enumerate(calls)]
        self.calls += calls
        return items

    # ----------------------------------------------------------------------------- named

    def _named_fragment(self, final: bool) -> list[dict]:
        text = self.text
        if self._start < 0:
            stripped = len(text) - len(text.lstrip())
            if stripped == len(text) and not final:
                return []
            self._start = stripped
            call = new_call(self.named, "")
            self.calls.append(call)
            header = {"index": 0, **call, "function": {"name": self.named, "arguments": ""}}
        else:
            header = None
        end = len(text.rstrip()) if final else _before_trailing_space(text, len(text), self._start + self._sent)
        fragment = text[self._start + self._sent:end]
        self._sent += len(fragment)
        self.calls[0]["function"]["arguments"] += fragment
        if header is not None:
            header["function"]["arguments"] = fragment
            return [header]
        return [{"index": 0, "function": {"arguments": fragment}}] if fragment else []

    # ----------------------------------------------------------------------------- required

    def _complete_items(self) -> list[dict]:
        calls = []
        for start, end in self._scan.objects(self.text):
            try:
                item = json.loads(self.text[start:end])
            except ValueError:
                item = None
            if not isinstance(item, dict) or item.get("name") not in self.names \
                    or not isinstance(item.get("parameters"), dict):
                self._scan.done = True  # the grammar writes nothing else
                break
            calls.append(new_call(item["name"], json.dumps(item["parameters"], ensure_ascii=False)))
        return self._add(calls)

    def _partial_call(self) -> list[dict]:
        """The call the list was cut in (``max_tokens``), once its name is complete: its arguments as
        far as they were written ("" before they began)."""
        scan = self._scan
        if scan.done or scan.depth == 0 or (self.max_calls is not None and len(self.calls) >= self.max_calls):
            return []
        match = _PARTIAL_NAME.match(self.text, scan.item_start)
        if match is None:
            return []
        try:
            name = json.loads(match.group(1))
        except ValueError:
            return []
        if name not in self.names:
            return []
        arguments = _ARGUMENTS_KEY.match(self.text, match.end())
        return [new_call(name, self.text[arguments.end():].rstrip() if arguments else "")]


class _ListScan:
    """Finds the complete objects of a JSON list as its text grows, reading each character once."""

    def __init__(self) -> None:
        self.position = 0
        self.opened = False
        self.done = False  # the list closed, or something other than a list (never, under the grammar)
        self.depth = 0
        self.in_string = False
        self.escaped = False
        self.item_start = -1

    def objects(self, text: str) -> list[tuple[int, int]]:
        found = []
        i = self.position
        while i < len(text) and not self.done:
            char = text[i]
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif char == "\\":
                    self.escaped = True
                elif char == '"':
                    self.in_string = False
            elif not self.opened:
                if char == "[":
                    self.opened = True
                elif not char.isspace():
                    self.done = True
            elif char == '"':
                self.in_string = True
            elif char in "{[":
                if self.depth == 0:
                    self.item_start = i
                self.depth += 1
            elif char in "}]":
                if self.depth == 0:  # the list's own "]"
                    self.done = True
                else:
                    self.depth -= 1
                    if self.depth == 0:
                        found.append((self.item_start, i + 1))
            i += 1
        self.position = i
        return found


# A "required" list's object up to its name, and from there to where its arguments begin (the
# grammar writes the keys in this order).
_PARTIAL_NAME = re.compile(r'\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")')
_ARGUMENTS_KEY = re.compile(r'\s*,\s*"parameters"\s*:\s*')
_SEPARATOR = re.compile(r"[\s;]*")


def _json_values(text: str) -> list:
    """The JSON values ``text`` is made of, separated by ``;`` or whitespace; [] if it is not only that."""
    values, decoder, end = [], json.JSONDecoder(), len(text)
    position = _SEPARATOR.match(text).end()
    while position < end:
        try:
            value, position = decoder.raw_decode(text, position)
        except (ValueError, RecursionError):  # nested past Python's parser: not a call either
            return []
        values.append(value)
        position = _SEPARATOR.match(text, position).end()
    return values


def _could_be_bare_call(head: str) -> bool:
    """Whether a reply beginning with ``head`` (from its first non-whitespace character) could still
    be a call's JSON without tags: it starts with ``{`` or ``[``, or with a markdown fence (plain or
    ``json``) whose first character is one, or with Llama 3.x's ``<|python_tag|>``."""
    if not head or head[0] in "{[":
        return True
    if head[0] == "<":
        if len(head) <= len(PYTHON_TAG):
            return PYTHON_TAG.startswith(head)
        return head.startswith(PYTHON_TAG) and _could_be_bare_call(head[len(PYTHON_TAG):].lstrip())
    if len(head) < 3:
        return "```".startswith(head)
    if not head.startswith("```"):
        return False
    rest = head[3:]
    if len(rest) < 4 and "json".startswith(rest):
        return True
    if rest.startswith("json"):
        rest = rest[4:]
    rest = rest.lstrip()
    return not rest or rest[0] in "{["


def _partial_suffix(text: str, tag: str) -> int:
    """The length of the longest end of ``text`` that is a proper beginning of ``tag``."""
    for length in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:length]):
            return length
    return 0


def _before_trailing_space(text: str, end: int, floor: int) -> int:
    """``end`` moved back over the whitespace before it, not below ``floor``."""
    while end > floor and text[end - 1].isspace():
        end -= 1
    return end
