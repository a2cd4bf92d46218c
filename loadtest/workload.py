"""Seeded workloads: prompt/output lengths, prompts (token ids or text), request bodies, arrivals."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Iterator, Optional, Union

# A neutral word list for --text-prompts (and always for chat, which cannot take token ids).
# Common English words are mostly one token each in BPE vocabularies, so N words ~ N tokens.
WORDS = (
    "the of and to in is was for that on with as by at from his an were are which this be or "
    "had not but first one their its new after who they have her she two been other when there "
    "all during into school time may years more most only over city some world would where later "
    "up such used many can state about national out known university united then made him "
    "team well while since people part year three season being both between under high also "
    "north south east west music film house river water light small large great long little "
    "early late old young good right left place found number group family called area game "
    "line name work home country history series system book album song station church war "
    "life power side left days way end back field town village road market island valley "
    "story member party court army ship club island design model energy paper letter garden"
).split()


@dataclass(frozen=True, slots=True)
class Range:
    """Inclusive integer range sampled uniformly (lo == hi for a fixed value)."""

    lo: int
    hi: int

    def sample(self, rng: random.Random) -> int:
        return self.lo if self.lo == self.hi else rng.randint(self.lo, self.hi)

    def __str__(self) -> str:
        return str(self.lo) if self.lo == self.hi else f"{self.lo}:{self.hi}"


def parse_range(text: str) -> Range:
    """``"128"`` or ``"100:1024"`` (also ``"100-1024"``, ``"100,1024"``) -> Range; ValueError if bad."""
    for sep in (":", "-", ","):
        if sep in text:
            lo_s, hi_s = text.split(sep, 1)
            lo, hi = int(lo_s), int(hi_s)
            break
    else:
        lo = hi = int(text)
    if lo < 1 or hi < lo:
        raise ValueError(f"bad range {text!r}: need 1 <= lo <= hi")
    return Range(lo, hi)


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request to send: what the workload decided, before any network."""

    index: int  # position in the level's sequence (0-based)
    prompt: Union[list[int], str]  # token ids, or text for --text-prompts / chat
    prompt_len: int  # tokens (token-id prompts) or words (text prompts)
    output_len: int  # max_tokens; with ignore_eos this is the output length


@dataclass(frozen=True, slots=True)
class WorkloadConfig:
    prompt_len: Range
    output_len: Range
    text_prompts: bool = False
    vocab_size: int = 10000  # token ids are drawn from [0, vocab_size), as in nano-vllm's bench
    seed: int = 0


def iter_specs(cfg: WorkloadConfig, stream: str = "") -> Iterator[RequestSpec]:
    """Endless deterministic sequence of requests for ``(cfg.seed, stream)``.

    Each level draws from its own stream name so that a later level does not resend the earlier
    level's prompts (a server with a prefix cache would otherwise serve them from cache).
    """
    rng = random.Random(f"{cfg.seed}/{stream}")
    index = 0
    while True:
        plen = cfg.prompt_len.sample(rng)
        olen = cfg.output_len.sample(rng)
        if cfg.text_prompts:
            prompt: Union[list[int], str] = " ".join(rng.choice(WORDS) for _ in range(plen))
        else:
            prompt = [rng.randrange(cfg.vocab_size) for _ in range(plen)]
        yield RequestSpec(index, prompt, plen, olen)
        index += 1


def poisson_arrivals(rate: float, seed: int, num: Optional[int] = None,
                     duration: Optional[float] = None, stream: str = "") -> list[float]:
    """Arrival times in seconds from 0 for a Poisson process of ``rate`` requests/s.

    Stops after ``num`` arrivals or at the last arrival before ``duration`` s, whichever comes
    first; at least one of them must be given. Deterministic for a given (rate, seed, stream).
    """
    if rate <= 0:
        raise ValueError("rate must be > 0")
    if num is None and duration is None:
        raise ValueError("give num or duration")
    rng = random.Random(f"{seed}/{stream}/arrivals")
    times: list[float] = []
    t = 0.0
    while num is None or len(times) < num:
        t += rng.expovariate(rate)
        if duration is not None and t >= duration:
            break
        times.append(t)
    return times


def build_body(spec: RequestSpec, model: str, endpoint: str, *, ignore_eos: bool = True,
               extra: Optional[dict] = None) -> dict:
    """JSON body for /v1/completions (``endpoint="completions"``) or /v1/chat/completions."""
    body: dict = {
        "model": model,
        "max_tokens": spec.output_len,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if ignore_eos:
        body["ignore_eos"] = True
    if endpoint == "chat":
        text = spec.prompt if isinstance(spec.prompt, str) else " ".join(map(str, spec.prompt))
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = spec.prompt
    if extra:
        body.update(extra)
    return body


ENDPOINT_PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
