"""Who drafts, how many tokens, and when speculation stands aside.

Every request may draft once its prefill is done, its last token known and its ``min_tokens``
reached (the mask depends on the row's position: before that it decodes without drafts, in the same
batch). Each verification row samples exactly as the step without drafts would (worker/model_runner.py
``_verification_rows`` and ``_verify``): greedy or sampled (the seeded noise of the row's own output
position), penalties counting the drafts before the row as output, logprobs from the row's raw
logits. So a request's tokens are those it gets without drafts.

Never slower (issue 16): a step carrying drafts is scheduled with every token known, so the engine
does not schedule the next step ahead of it (async scheduling's overlap is lost for that step), and
its verification rows cost compute. So speculation stands aside
- above ``disable_by_batch_size`` running requests (default ``DEFAULT_MAX_RUNNING``): a throughput-
  bound batch gains nothing from drafts and runs exactly as if speculation were off, async
  scheduling included;
- for a request whose last attempt found no n-gram match or had every draft rejected: it waits 1,
  2, 4, ... up to ``MAX_BACKOFF_STEPS`` decode grants before it tries again (reset by an accepted
  draft; the scheduler counts the wait down, with async scheduling too, and the engine goes back to
  lockstep once a wait is over), so a request whose text does not repeat itself soon costs an
  occasional lookup and an occasional step without overlap;
- for a batch whose drafts would not pay for the lockstep: a step is scheduled with every token known
  only when the requests ready to draft are expected to get at least ``MIN_GAIN_PER_REQUEST``
  accepted tokens for each other running request (each request's expectation: a decaying average of
  its own attempts' accepted tokens, ``draft_yield``, from ``PRIOR_YIELD`` before the first),
  or once every ``EXPLORE_STEPS`` steps, so that expectations can recover. One request ready to
  draft in a batch of 16 would otherwise take the overlap from all 16 for the few tokens it may get;
  alone, a request drafts whenever its wait is over;
- where drafting has not paid at this batch size, measured (spec_decode/payoff.py: tokens per
  second of the steps scheduled for drafts against those scheduled ahead, per batch-size bucket,
  with the losing kind tried now and then);
- for the verification step's size: the drafts of one step stop at ``max_step_tokens`` tokens in
  all (the engine's largest CUDA-graph token bucket), so a step with drafts is never eager;
- for everyone, when drafting stops paying across the batch: an attempt costs a step in lockstep
  (async scheduling took the 0.5b shape's batch-1 decode from 1.34 to 1.12 ms a token, so about
  20 %), and pays with the tokens it gets accepted. When the recent attempts (a decaying window of
  about ``1 / (1 - WINDOW_DECAY)`` of them) got fewer than ``MIN_TOKENS_PER_ATTEMPT`` accepted
  tokens each, speculation pauses for ``PAUSE_STEPS`` steps: the engine runs as if it were off,
  then tries again.
"""

from __future__ import annotations

from aioinfer.config import SpeculativeConfig
from aioinfer.spec_decode.ngram import NgramIndex
from aioinfer.spec_decode.payoff import DraftPayoff

# Measured on the H200 (SmolLM2-135M, bf16, k = 4 and 8): batches of 16 gained 9-34 % with drafts,
# batches of 32 lost 6-29 % (a step for drafts cost 2.99 ms against 1.26 ms ahead); in float32 the
# gain held up to 32. Above this many running requests, speculation stands aside.
DEFAULT_MAX_RUNNING = 16
MAX_BACKOFF_STEPS = 16
MIN_TOKENS_PER_ATTEMPT = 0.2
WINDOW_DECAY = 0.98
MIN_EVIDENCE = 32.0  # attempts (decayed) before the window may pause speculation
PAUSE_STEPS = 256
# A floor under the measured payoff (payoff.py): a step for drafts must expect at least this many
# accepted tokens for each other running request (lockstep cost a fifth of a step at batch 1 on
# the 0.5b shape, see above, and more in larger batches).
MIN_GAIN_PER_REQUEST = 0.25
YIELD_DECAY = 0.5  # weight of a request's earlier attempts in its ``draft_yield``
# A request's expectation only changes when it tries: every this many steps the ready ones may try
# whatever they expect (a text may start repeating itself later), at a cost of one lockstep step.
EXPLORE_STEPS = 32
PRIOR_YIELD = 1.0  # expected accepted tokens of a request's first attempt
DEFAULT_MAX_STEP_TOKENS = 256  # EngineConfig.max_cuda_graph_prefill_tokens' default


class DraftPolicy:
    def __init__(self, config: SpeculativeConfig, max_step_tokens: int = DEFAULT_MAX_STEP_TOKENS) -> None:
        self.config = config
        self.k = config.num_speculative_tokens
        self.max_running = config.disable_by_batch_size or DEFAULT_MAX_RUNNING
        self.max_step_tokens = max_step_tokens
        self.totals = VerificationCounts(self.k)  # since the start (vLLM's spec_decode counters)
        self._step = VerificationCounts(self.k)  # since the last ``take_step_counts``
        self.num_pauses = 0
        self._window_attempts = self._window_accepted = 0.0  # decaying: the recent attempts' yield
        self._paused_for = 0  # steps left in a pause
        self._steps_since_lockstep = 0  # steps since one was scheduled for drafts (async scheduling)
        self.payoff = DraftPayoff()  # measured tokens/s with and without drafts, per batch size
        # Whether the next step may carry drafts: under async scheduling the engine's last decision
        # (``wants_known_tokens``), also after a step with drafts, which is always followed by one in
        # lockstep; without async scheduling, always.
        self.allow_drafts = True

    def begin_step(self) -> None:
        """Once per scheduled step: a pause counts down."""
        self._steps_since_lockstep += 1
        if self._paused_for:
            self._paused_for -= 1

    def active(self, num_running: int) -> bool:
        return not self._paused_for and num_running <= self.max_running

    def wants_known_tokens(self, running, lockstep_anyway: bool = False) -> bool:
        """Under async scheduling, once per launched step: whether the next step should carry drafts
        (and so be scheduled with every token known, not ahead of this one): the running requests
        ready to draft are expected to pay for the lockstep, or it is time to let them try again
        (``EXPLORE_STEPS``), and drafting has paid at this batch size (payoff.py).
        ``lockstep_anyway``: the next step is scheduled with every token known whatever this says
        (a request with penalties runs): drafts then cost no overlap, and any ready request drafts."""
        self.allow_drafts = self._drafts_pay(running, lockstep_anyway)
        return self.allow_drafts

    def _drafts_pay(self, running, lockstep_anyway: bool) -> bool:
        if not self.active(len(running)):
            return False
        ready, expected = False, 0.0
        for r in running:
            if r.draft_wait == 0 and r.num_computed_tokens >= len(r.prompt_token_ids):
                ready = True
                expected += PRIOR_YIELD if r.draft_yield is None else r.draft_yield
        if not ready:
            return False
        if lockstep_anyway:
            return True
        if not self.payoff.prefers_drafts(len(running)):
            return False
        if expected >= MIN_GAIN_PER_REQUEST * (len(running) - 1) or self._steps_since_lockstep >= EXPLORE_STEPS:
            self._steps_since_lockstep = 0
            return True
        return False

    def step_draft_room(self, num_running: int) -> int:
        """Draft tokens one step may carry beside its running requests' decode tokens."""
        return max(0, self.max_step_tokens - num_running)

    def drafts_for(self, request, budget: int) -> list[int]:
        """Draft tokens for a decode grant of ``request`` (every token known, prefill done, no wait
        left: the scheduler counts the waits down), within ``budget`` tokens for the grant (the decode
        token included) and the request's length limit."""
        output = request.output_token_ids
        k = min(self.k, budget - 1, request.length_limit - len(output) - 1)
        if k <= 0 or len(output) < request.sampling_params.min_tokens:
            return []
        index = request.ngram_index
        if index is None:
            index = request.ngram_index = NgramIndex(request.prompt_token_ids, self.config.prompt_lookup_min,
                                                     self.config.prompt_lookup_max)
        drafts = index.propose(output, k)
        if not drafts:
            self._back_off(request)
            self._yielded(request, 0)
            self._attempted(0)  # known at once: nothing to verify
        return drafts

    def verified(self, request, num_drafts: int, num_accepted: int) -> None:
        """After a verification round: count it, and back off a request whose drafts all failed."""
        self.totals.add(num_drafts, num_accepted)
        self._step.add(num_drafts, num_accepted)
        self._yielded(request, num_accepted)
        self._attempted(num_accepted)
        request.num_draft_tokens_total += num_drafts
        request.num_accepted_tokens_total += num_accepted
        if num_accepted:
            request.draft_backoff = 0
        else:
            self._back_off(request)

    def _yielded(self, request, num_accepted: int) -> None:
        previous = PRIOR_YIELD if request.draft_yield is None else request.draft_yield
        request.draft_yield = YIELD_DECAY * previous + (1.0 - YIELD_DECAY) * num_accepted

    def _attempted(self, num_accepted: int) -> None:
        """An attempt's outcome (no match: 0 at once; drafts: once verified): the window decays, and
        speculation pauses when the recent attempts did not pay."""
        self._window_attempts = self._window_attempts * WINDOW_DECAY + 1.0
        self._window_accepted = self._window_accepted * WINDOW_DECAY + num_accepted
        if (self._window_attempts >= MIN_EVIDENCE
                and self._window_accepted < MIN_TOKENS_PER_ATTEMPT * self._window_attempts):
            self._paused_for = PAUSE_STEPS
            self.num_pauses += 1
            self._window_attempts = self._window_accepted = 0.0

    # The totals, by their own names (tests, the offline LLM's users).
    num_drafts = property(lambda self: self.totals.num_drafts)
    num_draft_tokens = property(lambda self: self.totals.num_draft_tokens)
    num_accepted_tokens = property(lambda self: self.totals.num_accepted_tokens)
    accepted_per_position = property(lambda self: self.totals.accepted_per_position)

    def take_step_counts(self) -> "VerificationCounts | None":
        """The verification counts since the last call (None when there were none): for metrics."""
        step = self._step
        if not step.num_drafts:
            return None
        self._step = VerificationCounts(self.k)
        return step

    @staticmethod
    def _back_off(request) -> None:
        wait = min(2 * request.draft_backoff or 1, MAX_BACKOFF_STEPS)
        request.draft_backoff = request.draft_wait = wait


class VerificationCounts:
    """Verification rounds (a request's drafts checked in one step), their draft tokens, the accepted
    ones, and per draft position how many rounds accepted it."""

    __slots__ = ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "accepted_per_position")

    def __init__(self, k: int) -> None:
        self.num_drafts = self.num_draft_tokens = self.num_accepted_tokens = 0
        self.accepted_per_position = [0] * k

    def add(self, num_drafts: int, num_accepted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += num_drafts
        self.num_accepted_tokens += num_accepted
        for position in range(num_accepted):
            self.accepted_per_position[position] += 1
