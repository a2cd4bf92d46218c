"""A request's output text: incremental detokenizer plus stop strings (TextAccumulator).

The engine calls ``append`` once per batch of new token ids and ``finish`` when the
request ends for another reason (EOS, length, abort). Every delta is final: the text
sent so far is always a prefix of the final text, and the deltas joined *are* ``text``.
To keep that promise with stop strings, the end of the text that could still grow into
a stop string is held back until it either does (and is cut) or cannot.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aioinfer.text.detokenizer import IncrementalDetokenizer
from aioinfer.text.stop_strings import StopChecker

if TYPE_CHECKING:
    from aioinfer.sampling_params import SamplingParams


@dataclass(slots=True, frozen=True)
class TextDelta:
    new_text: str  # new text to send to the client ('' is common)
    stopped: bool  # a stop string matched: the request is finished, ignore further tokens
    stop_reason: str | None  # the stop string that matched, when stopped


class TextAccumulator:
    """Accumulates one request's text; not thread-safe (one owner, the event loop).

    ``params`` (a SamplingParams), when given, supplies ``stop``,
    ``include_stop_str_in_output``, ``skip_special_tokens`` and
    ``spaces_between_special_tokens``, and the keyword arguments are ignored.
    """

    __slots__ = ("detokenizer", "stop_checker", "_pieces", "_held", "stop_reason", "_done", "_no_stops")

    def __init__(self, tokenizer: Any, prompt_token_ids: Sequence[int] | None = None,
                 params: SamplingParams | None = None, *,
                 stop: Sequence[str] = (), include_stop_str_in_output: bool = False,
                 skip_special_tokens: bool = True, spaces_between_special_tokens: bool = True) -> None:
        if params is not None:
            stop = params.stop or ()
            include_stop_str_in_output = params.include_stop_str_in_output
            skip_special_tokens = params.skip_special_tokens
            spaces_between_special_tokens = params.spaces_between_special_tokens
        self.detokenizer = IncrementalDetokenizer(
            tokenizer, prompt_token_ids, skip_special_tokens, spaces_between_special_tokens)
        self.stop_checker = StopChecker(stop, include_stop_str_in_output)
        self._pieces: list[str] = []  # text sent so far, in deltas
        self._held = ""  # decoded but unsent: it may be the start of a stop string
        self.stop_reason: str | None = None  # the stop string that ended the text (read-only outside)
        self._done = False  # stopped or finished: later calls add nothing
        self._no_stops = not self.stop_checker.stops  # nothing to hold back or match: the per-token fast path

    @property
    def text(self) -> str:
        """The text sent so far; after ``finish`` or a stop, the final text."""
        return "".join(self._pieces)

    @property
    def stopped(self) -> bool:
        return self.stop_reason is not None

    def _advance(self, new: str, final: bool) -> str:
        buf = self._held + new
        match = self.stop_checker.check(buf, len(new))
        if match is not None:
            out, self._held = buf[: match.truncate_at], ""
            self.stop_reason = match.stop
            self._done = True
        else:
            keep = 0 if final else self.stop_checker.holdback(buf)
            out, self._held = buf[: len(buf) - keep], buf[len(buf) - keep:]
        if out:
            self._pieces.append(out)
        return out

    def append(self, token_ids: Sequence[int]) -> TextDelta:
        """Add the step's new token ids; return what may be sent now."""
        out = self.append_text(token_ids)
        return TextDelta(out, self.stopped, self.stop_reason)

    def append_text(self, token_ids: Sequence[int]) -> str:
        """``append`` for the per-token path: the text that may be sent now; ``stopped`` and
        ``stop_reason`` say whether a stop string ended the request."""
        if self._done:
            return ""
        new = self.detokenizer.push(token_ids)
        if self._no_stops:  # no stop strings: nothing is ever held back
            if new:
                self._pieces.append(new)
            return new
        return self._advance(new, final=False)

    def finish(self) -> str:
        """End of the request: return the rest (held bytes and held text). Idempotent.

        The flushed text is still checked for stop strings, so ``text`` never contains
        one; check ``stopped`` afterwards if the finish reason matters.
        """
        if self._done:
            return ""
        out = self._advance(self.detokenizer.flush(), final=True)
        self._done = True
        return out
