"""Drafts from the true continuation, for tests of speculative decoding on random tiny models.

Random weights rarely repeat their prompt, so the real n-gram proposer seldom fires on them; this
stands in for it: the next k tokens of a run without speculation, cut at a random length and
sometimes corrupted, so that every step verifies drafts partly right and partly wrong. Everything
else (verification, acceptance, roll-back, the scheduler's paths) is the engine's own.
"""

from __future__ import annotations

import random

from aioinfer.spec_decode import ngram


def install_oracle(monkeypatch, continuations: dict[tuple[int, ...], list[int]], corrupt: float = 0.3,
                   seed: int = 1) -> None:
    """Replace ``NgramIndex.propose`` for the test: ``continuations`` maps each prompt (a tuple of ids)
    to its output without speculation; one draft is replaced with probability ``corrupt``."""
    rng = random.Random(seed)

    def propose(self, output_token_ids, k):
        self.tokens += output_token_ids[self._num_output:]
        self._num_output = len(output_token_ids)
        prompt = tuple(self.tokens[:len(self.tokens) - self._num_output])
        drafts = list(continuations[prompt][len(output_token_ids):len(output_token_ids) + k])
        drafts = drafts[:rng.randint(0, len(drafts))]
        if drafts and rng.random() < corrupt:
            drafts[rng.randrange(len(drafts))] = rng.randrange(3, 400)
        return drafts

    monkeypatch.setattr(ngram.NgramIndex, "propose", propose)
