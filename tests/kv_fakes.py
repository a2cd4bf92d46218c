"""A fake paged runner whose KV depends on the whole prefix, with host swap space, for scheduler tests.

Each KV slot holds ``(token, digest)`` where ``digest = hash((digest of the previous position, token))``,
like real attention KV, which depends on every earlier token. Sampling reads the context back
through the block table, checks that the digests chain, and samples ``next_token`` of its tokens:
a block reused from another prefix (a wrong prefix-cache hit), a stale block, a lost swap or a
swap into the wrong blocks either breaks the chain (AssertionError) or changes the tokens.

With it, the scheduler tests' kit: the fake model (``next_token``) and its ``reference`` outputs,
``request``, ``run_to_end`` and ``make`` (a scheduler over this runner).
"""

from __future__ import annotations

from aioinfer.config import SchedulerConfig
from aioinfer.core.kv_cache_manager import KVCacheManager
from aioinfer.core.scheduler import PLACEHOLDER_TOKEN, Scheduler
from aioinfer.core.scheduler_output import RunnerOutput, SchedulerOutput
from aioinfer.request import Request
from aioinfer.sampling_params import SamplingParams

ROOT = 0x5EED


class ChainedKVRunner:
    def __init__(self, num_blocks: int, block_size: int, num_host_blocks: int = 0) -> None:
        self.block_size = block_size
        self.slots: list = [None] * (num_blocks * block_size)
        self.host: list = [None] * (num_host_blocks * block_size)
        self.writer: dict[int, str] = {}  # device block -> request that last wrote KV into it
        self.last_sampled: dict[str, int] = {}
        self.num_swapped_out = self.num_swapped_in = 0

    def _slot(self, block_ids, position: int) -> int:
        return block_ids[position // self.block_size] * self.block_size + position % self.block_size

    def _copy_blocks(self, src: list, src_blocks, dst: list, dst_blocks) -> None:
        bs = self.block_size
        for s, d in zip(src_blocks, dst_blocks, strict=True):
            dst[d * bs:(d + 1) * bs] = src[s * bs:(s + 1) * bs]

    def execute(self, out: SchedulerOutput) -> RunnerOutput:
        # The runner's contract: every swap-out, then every swap-in, then the forward.
        for s in out.swap_out:
            n = len(s.device_block_ids)
            self._copy_blocks(self.slots, s.device_block_ids, self.host, range(s.host_start, s.host_start + n))
            self.num_swapped_out += 1
        for s in out.swap_in:
            n = len(s.device_block_ids)
            self._copy_blocks(self.host, range(s.host_start, s.host_start + n), self.slots, s.device_block_ids)
            for block in s.device_block_ids:
                self.writer[block] = s.request_id
            self.num_swapped_in += 1
        ids, tokens = [], []
        for item in out.scheduled:
            for i, token in enumerate(item.token_ids):
                if token == PLACEHOLDER_TOKEN:  # async scheduling: what the previous step sampled
                    token = self.last_sampled[item.request_id]
                pos = item.start_position + i
                previous = self.slots[self._slot(item.block_ids, pos - 1)][1] if pos else ROOT
                self.slots[self._slot(item.block_ids, pos)] = (token, hash((previous, token)))
                self.writer[item.block_ids[pos // self.block_size]] = item.request_id
            if item.samples:
                end = item.start_position + len(item.token_ids)
                context = [self.slots[self._slot(item.block_ids, p)] for p in range(end)]
                digest = ROOT
                for p, (token, kv_digest) in enumerate(context):
                    digest = hash((digest, token))
                    assert kv_digest == digest, f"{item.request_id}: KV at position {p} belongs to another prefix"
                ids.append(item.request_id)
                tokens.append(next_token([token for token, _ in context]))
        self.last_sampled = dict(zip(ids, tokens))
        return RunnerOutput(sampled_request_ids=ids, sampled_token_ids=tokens)


VOCAB = 1000


def next_token(context: list[int]) -> int:
    """The fake model: a deterministic function of the whole context."""
    return hash(tuple(context)) % VOCAB


def reference(prompt: list[int], max_tokens: int) -> list[int]:
    seq = list(prompt)
    for _ in range(max_tokens):
        seq.append(next_token(seq))
    return seq[len(prompt):]


def request(rid: str, prompt: list[int], max_tokens: int, **params) -> Request:
    return Request(request_id=rid, prompt_token_ids=prompt, sampling_params=SamplingParams(max_tokens=max_tokens,
                   ignore_eos=True, **params), max_tokens=max_tokens)


def run_to_end(sched, runner, check=True, max_steps=10_000):
    outputs: dict[str, list[int]] = {}
    finish: dict[str, str] = {}
    steps = []
    for _ in range(max_steps):
        if not sched.has_unfinished():
            break
        out = sched.schedule()
        steps.append(out)
        assert out.num_scheduled_tokens <= sched.config.max_num_batched_tokens
        assert len(out.scheduled) <= sched.config.max_num_seqs
        for core_out in sched.update(out, runner.execute(out)):
            outputs.setdefault(core_out.request_id, []).extend(core_out.new_token_ids)
            if core_out.finish_reason:
                finish[core_out.request_id] = core_out.finish_reason
        if check:
            sched.check_invariants()
    assert not sched.has_unfinished()
    return outputs, finish, steps


def make(num_blocks=64, block_size=4, budget=64, max_num_seqs=8, mode="recompute", host_blocks=0,
         aging_steps=1000, prefix_caching=True):
    kv = KVCacheManager(num_blocks, block_size, enable_prefix_caching=prefix_caching)
    config = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, preemption_mode=mode)
    sched = Scheduler(config, kv, 512, num_host_blocks=host_blocks, priority_aging_steps=aging_steps)
    return sched, ChainedKVRunner(num_blocks, block_size, host_blocks)


def prioritized(rid, prompt, max_tokens, priority):
    r = request(rid, prompt, max_tokens)
    r.priority = priority
    return r
