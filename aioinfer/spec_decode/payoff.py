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


class _Bucket:
    """One bucket of batch sizes: the rate of each kind of step, and the current choice's re-tries."""

    __slots__ = ("drafting", "ahead", "choice", "period", "since", "trying")

    def __init__(self) -> None:
        self.drafting, self.ahead = _Rate(), _Rate()
        self.choice: bool | None = None
        self.period = EXPLORE_MIN
        self.since = 0  # decisions since the other kind was last tried
        self.trying = 0  # decisions left in a try of the losing kind


class DraftPayoff:
    def __init__(self) -> None:
        self._buckets: dict[int, _Bucket] = {}

    @staticmethod
    def bucket(num_running: int) -> int:
        """Every size up to 4; then two buckets an octave (the size's top two bits)."""
        if num_running <= 4:
            return num_running
        shift = num_running.bit_length() - 2
        return (num_running >> shift) << shift

    def _get(self, num_running: int) -> _Bucket:
        key = self.bucket(num_running)
        found = self._buckets.get(key)
        if found is None:
            found = self._buckets[key] = _Bucket()
        return found

    def observe(self, num_running: int, lockstep: bool, num_tokens: int, seconds: float) -> None:
        """A decode step's output tokens and the seconds since the step before it ended; ``lockstep``:
        it was scheduled with every token known (for drafts) rather than ahead."""
        if not 0.0 < seconds <= MAX_STEP_SECONDS:
            return
        b = self._get(num_running)
        (b.drafting if lockstep else b.ahead).add(num_tokens / num_running, seconds)

    def prefers_drafts(self, num_running: int) -> bool:
        """Whether the next step should be scheduled for drafts; one call per decision."""
        if num_running <= ALWAYS_DRAFT_UP_TO:
            return True
        b = self._buckets.get(self.bucket(num_running))
        if b is None or b.drafting.steps < MIN_STEPS:
            return True  # learn what drafts pay here
        if b.ahead.steps < MIN_STEPS:
            return False  # ... and what the overlap does
        best = b.drafting.per_second > b.ahead.per_second
        if b.choice != best:  # the choice changed: try the other kind soon
            b.choice, b.period, b.since, b.trying = best, EXPLORE_MIN, 0, 0
        if b.trying:
            b.trying -= 1
            return not best
        b.since += 1
        if b.since >= b.period:
            b.since, b.period, b.trying = 0, min(2 * b.period, EXPLORE_MAX), MIN_STEPS - 1
            return not best
        return best

    def rates(self) -> dict[int, tuple[float, float]]:
        """Per bucket (named by its smallest batch size): tokens/s per running request (drafting,
        ahead), for logs and benchmarks."""
        return {key: (b.drafting.per_second, b.ahead.per_second) for key, b in sorted(self._buckets.items())}
