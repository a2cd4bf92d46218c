"""Whether drafting pays at this batch size, measured: output tokens per second of the steps
scheduled for drafts (in lockstep) against those scheduled ahead (async scheduling's overlap).

What a verification step costs depends on everything at once: the model's size, the host's speed,
the batch, how often the drafts are right. On the H200 with SmolLM2-135M, a step with drafts cost
1.2-1.8 ms at batch 1 against 0.88 ms for a decode step scheduled ahead (drafting won 2-2.8x), and
2.99 ms at batch 32 against 1.26 ms (the same drafts lost 30 %: at 32 requests the host work that
async scheduling hides is most of the step). So rather than guess, the engine times both kinds of
step per batch-size bucket and schedules for drafts where they yield more tokens per second and
running request, trying the other kind now and then (every ``EXPLORE_MIN`` decisions, doubling up
to ``EXPLORE_MAX`` while the choice stands) so that the measurements follow a changing batch.

The rate is per running request and the buckets are narrow (every size up to 4, then half an
octave: 4-5, 6-7, 8-11, 12-15, 16-23, 24-31, ...) because a batch's plain tokens per second grow
with its size: in one bucket of 16-31 requests, steps ahead measured at 16 and steps with drafts
at 30 would compare batches, not kinds of step.

Up to ``ALWAYS_DRAFT_UP_TO`` running requests drafts are not measured against the overlap: they won
there in every configuration measured (SmolLM2 bf16 and float32, k = 4 and 8: 1.05-1.8x the
tokens per second), and learning costs steps that a batch of one cannot spare. The losing kind is
tried for ``MIN_STEPS`` decisions at a time: one step of a kind, right after the other, measures the
switch rather than the kind.

Only decode steps count (a prefill chunk's cost says nothing about drafts), and only under async
scheduling: without it every step is in lockstep anyway and drafts cost only their compute.
"""

from __future__ import annotations

MIN_STEPS = 4  # steps of a kind measured in a bucket before its rate is trusted
RATE_DECAY = 0.9  # weight of the earlier steps in a bucket's rate
EXPLORE_MIN = 16
EXPLORE_MAX = 128  # a wrong early choice (noisy first steps) is revisited within this many decisions
ALWAYS_DRAFT_UP_TO = 4  # running requests: drafts won at every such size measured (see below)
MAX_STEP_SECONDS = 1.0  # a longer interval was not one step's work (the engine sat idle)


class _Rate:
    __slots__ = ("tokens", "seconds", "steps")

    def __init__(self) -> None:
        self.tokens = self.seconds = 0.0
        self.steps = 0

    def add(self, tokens: int, seconds: float) -> None:
        self.tokens = self.tokens * RATE_DECAY + tokens
        self.seconds = self.seconds * RATE_DECAY + seconds
        self.steps += 1

    @property
    def per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


class DraftPayoff:
    def __init__(self) -> None:
        self._drafting: dict[int, _Rate] = {}
        self._ahead: dict[int, _Rate] = {}
        self._since: dict[int, int] = {}  # decisions since the other kind was last tried
        self._period: dict[int, int] = {}
        self._choice: dict[int, bool] = {}
        self._trying: dict[int, int] = {}  # decisions left in a try of the losing kind

    @staticmethod
    def bucket(num_running: int) -> int:
        """Every size up to 4; then two buckets an octave (the size's top two bits)."""
        if num_running <= 4:
            return num_running
        shift = num_running.bit_length() - 2
        return (num_running >> shift) << shift

    def observe(self, num_running: int, lockstep: bool, num_tokens: int, seconds: float) -> None:
        """A decode step's output tokens and the seconds since the step before it ended; ``lockstep``:
        it was scheduled with every token known (for drafts) rather than ahead."""
        if not 0.0 < seconds <= MAX_STEP_SECONDS:
            return
        rates = self._drafting if lockstep else self._ahead
        bucket = self.bucket(num_running)
        rate = rates.get(bucket)
        if rate is None:
            rate = rates[bucket] = _Rate()
        rate.add(num_tokens / num_running, seconds)

    def prefers_drafts(self, num_running: int) -> bool:
        """Whether the next step should be scheduled for drafts; one call per decision."""
        if num_running <= ALWAYS_DRAFT_UP_TO:
            return True
        bucket = self.bucket(num_running)
        drafting, ahead = self._drafting.get(bucket), self._ahead.get(bucket)
        if drafting is None or drafting.steps < MIN_STEPS:
            return True  # learn what drafts pay here
        if ahead is None or ahead.steps < MIN_STEPS:
            return False  # ... and what the overlap does
        best = drafting.per_second > ahead.per_second
        if self._choice.get(bucket) != best:  # the choice changed: try the other kind soon
            self._choice[bucket] = best
            self._period[bucket] = EXPLORE_MIN
            self._since[bucket] = self._trying[bucket] = 0
        if self._trying[bucket]:
            self._trying[bucket] -= 1
            return not best
        since = self._since[bucket] = self._since[bucket] + 1
        if since >= self._period[bucket]:
            self._since[bucket] = 0
            self._period[bucket] = min(2 * self._period[bucket], EXPLORE_MAX)
            self._trying[bucket] = MIN_STEPS - 1
            return not best
        return best

    def rates(self) -> dict[int, tuple[float, float]]:
        """Per bucket (named by its smallest batch size): tokens/s per running request (drafting,
        ahead), for logs and benchmarks."""
        buckets = sorted(set(self._drafting) | set(self._ahead))
        return {b: (self._drafting[b].per_second if b in self._drafting else 0.0,
                    self._ahead[b].per_second if b in self._ahead else 0.0) for b in buckets}
