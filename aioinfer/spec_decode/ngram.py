"""Prompt-lookup drafts: the tokens that followed the last earlier occurrence of the sequence's suffix.

For n from ``max_n`` down to ``min_n``, the last n tokens are looked up among the earlier n-grams of
prompt + output; the first hit proposes the (up to k) tokens that followed it. Each n-gram's latest
end position is kept in a dict per n, extended by the tokens added since the last call, so a step's
proposal costs a few tuple lookups instead of a scan of the sequence (it runs under the same
interpreter lock as everything else on the engine thread).
"""

from __future__ import annotations


_BULK = 16  # new positions above which the index is extended in bulk


class NgramIndex:
    """One request's n-gram index over its prompt and output tokens."""

    __slots__ = ("min_n", "max_n", "tokens", "_ends", "_indexed", "_num_output")

    def __init__(self, prompt_token_ids: list[int], min_n: int, max_n: int) -> None:
        self.min_n, self.max_n = min_n, max_n
        self.tokens: list[int] = list(prompt_token_ids)  # prompt + output as far as seen
        self._ends: list[dict[tuple[int, ...], int]] = [{} for _ in range(max_n - min_n + 1)]
        self._indexed = 0  # n-grams ending before this position are in ``_ends``
        self._num_output = 0  # output tokens appended to ``tokens``

    def propose(self, output_token_ids: list[int], k: int) -> list[int]:
        """Up to ``k`` draft tokens to follow prompt + ``output_token_ids`` (the request's whole
        output so far, of which this index has seen a prefix); [] when no suffix recurs."""
        tokens = self.tokens
        if len(output_token_ids) > self._num_output:
            tokens += output_token_ids[self._num_output:]
            self._num_output = len(output_token_ids)
        last = len(tokens) - 1
        # Index the n-grams ending at positions before the last: the suffix (ending at the last) must
        # find an earlier occurrence, never itself. The latest occurrence wins (dict overwrite).
        min_n, ends = self.min_n, self._ends
        start = self._indexed
        if last - start > _BULK:
            # Many new positions (the prompt, at the first call): per n, the n-grams ending at each
            # position as one zip of shifted slices, so the loop runs in C; a dict update keeps the
            # latest end of a repeated n-gram, as the one-by-one path does.
            for i, table in enumerate(ends):
                n = min_n + i
                first = max(start, n - 1)
                if first < last:
                    grams = zip(*(tokens[first + 1 - n + j:last + 1 - n + j] for j in range(n)))
                    table.update(zip(grams, range(first, last)))
        else:
            for end in range(start, last):
                for i, table in enumerate(ends):
                    n = min_n + i
                    if end + 1 < n:
                        break
                    table[tuple(tokens[end + 1 - n:end + 1])] = end
        if last > start:
            self._indexed = last
        for i in range(len(ends) - 1, -1, -1):
            n = min_n + i
            if n > last:  # the suffix and an earlier copy need at least n + 1 tokens
                continue
            end = ends[i].get(tuple(tokens[last + 1 - n:]))
            if end is not None:
                return tokens[end + 1:end + 1 + k]
        return []
