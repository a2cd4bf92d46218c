"""Stop strings: where a request's text ends, and how much of it streaming must hold back.

The checker works on the tail of the text that may still hold a stop string (see
``TextAccumulator``), never on the whole output, so a step costs O(new text + longest stop).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class StopMatch:
    stop: str  # the stop string that matched
    start: int  # index (chars) in the checked text where it begins
    truncate_at: int  # chars of the checked text to keep: start, or its end if included


class StopChecker:
    """Finds stop strings in text that grows at the end.

    Of several stop strings, or several occurrences, the one that *ends* first wins (then
    the one starting first): that is the one a character-by-character stream would meet
    first, so the result does not depend on how many tokens each step added.
    """

    __slots__ = ("stops", "include_stop_str_in_output", "max_len")

    def __init__(self, stop: Sequence[str], include_stop_str_in_output: bool = False) -> None:
        if isinstance(stop, str):
            stop = [stop]
        if any(not s for s in stop):
            raise ValueError("stop strings must be non-empty")
        self.stops: tuple[str, ...] = tuple(dict.fromkeys(stop))  # deduplicated, order kept
        self.include_stop_str_in_output = include_stop_str_in_output
        self.max_len = max(map(len, self.stops), default=0)  # chars

    @property
    def max_holdback(self) -> int:
        """Most chars ``holdback`` can return: the longest stop string, less one."""
        return max(self.max_len - 1, 0)

    def check(self, text: str, new_text_len: int) -> StopMatch | None:
        """The first stop string in ``text`` that overlaps its last ``new_text_len`` chars.

        Text before that was checked on an earlier call, so matches lying wholly inside
        it are not looked for again.
        """
        if not self.stops or new_text_len <= 0:
            return None
        old_len = len(text) - new_text_len
        best: tuple[int, int, str] | None = None  # (end, start, stop)
        for s in self.stops:
            # Ending after old_len means starting after old_len - len(s).
            i = text.find(s, max(0, old_len - len(s) + 1))
            if i >= 0 and (best is None or (i + len(s), i) < best[:2]):
                best = (i + len(s), i, s)
        if best is None:
            return None
        end, start, s = best
        return StopMatch(s, start, end if self.include_stop_str_in_output else start)

    def holdback(self, text: str) -> int:
        """Chars at the end of ``text`` that may begin a stop string and so cannot be sent.

        The longest suffix that is a proper prefix of some stop string: anything shorter
        than ``max_holdback`` is released as soon as it cannot be part of a stop.
        """
        longest = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(text)), longest, -1):
                if text.endswith(s[:k]):
                    longest = k
                    break
        return longest
