"""Runs one scheduled step on the model: builds the flat batch, runs forward, samples.

Owns all torch state (weights, KV cache, sampler). Lives on the GPU thread.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from aioinfer.attention.context import forward_context
from aioinfer.config import EngineConfig
from aioinfer.core.scheduler_output import RunnerOutput, SchedulerOutput, TokenLogprobs
from aioinfer.core.kv_cache_manager import cdiv
from aioinfer.sampling_params import MAX_LOGPROBS, num_logprobs
from aioinfer.worker.cuda_graphs import CudaGraphRunner, graph_buckets, token_buckets
from aioinfer.structured_output.grammar_mask import GrammarMasks, PendingMask, StepMask, live_tokens
from aioinfer.worker.input_buffers import InputBuffers, StepInputs
from aioinfer.worker.kv_cache import KVCacheSpec, allocate_kv_caches
from aioinfer.structured_output.masked_greedy import MaskedGreedy, masked_greedy
from aioinfer.sample.prompt_logprobs import PendingPromptLogprobs, PromptLogprobs
from aioinfer.sample.sampler import Sampler, SamplerOutput
from aioinfer.sample.sampling_metadata import SamplingMetadata, SamplingMetadataCache, SamplingRow
from aioinfer.worker.swap import KVSwapper, num_host_blocks_for

logger = logging.getLogger(__name__)


class ModelRunner:
    def __init__(self, config: EngineConfig, model: torch.nn.Module, arch, device: torch.device,
                 dtype: torch.dtype, max_model_len: int, spec: KVCacheSpec, num_kv_blocks: int) -> None:
        """``spec`` and ``num_kv_blocks``: the KV cache to allocate, as the executor sized it
        (executor/runner_setup.py; every tensor-parallel rank the same count)."""
        self.config = config
        self.model = model
        self.arch = arch
        self.device = device
        self.dtype = dtype
        self.block_size = config.cache.block_size
        self.vocab_size = arch.vocab_size
        self.spec = spec
        started = time.perf_counter()
        self.num_kv_blocks = num_kv_blocks
        self.kv_caches = allocate_kv_caches(self.spec, self.num_kv_blocks, device)
        kv_bytes = self.spec.bytes_per_block * self.num_kv_blocks
        logger.info("KV cache: %d blocks of %d tokens, %d bytes (%.1f MiB) on %s, allocated in %.2f s",
                    self.num_kv_blocks, self.block_size, kv_bytes, kv_bytes / 2**20, device,
                    time.perf_counter() - started)
        for layer, cache in zip(model.attention_layers(), self.kv_caches):
            layer.kv_cache = cache
        # Swap preemption: the host pool the scheduler hands out runs of (0 blocks: recompute only).
        self.num_host_blocks = num_host_blocks_for(config, self.spec)
        self.swapper = (KVSwapper(self.kv_caches, self.spec, self.num_host_blocks, device)
                        if self.num_host_blocks else None)
        max_blocks_per_seq = cdiv(max_model_len, self.block_size)
        self.inputs = InputBuffers(config.scheduler.max_num_batched_tokens, config.scheduler.max_num_seqs,
                                   max_blocks_per_seq, self.block_size, device)
        backend = model.attention_layers()[0].backend
        max_bs = min(config.max_cuda_graph_batch_size, config.scheduler.max_num_seqs,
                     config.scheduler.max_num_batched_tokens)
        self._decode_buckets = graph_buckets(max_bs)
        self._split_policy = getattr(backend, "num_splits_for", None)
        self._splits_by_bucket: dict[int, Optional[int]] = {}
        self._prefill_split_policy = getattr(backend, "prefill_splits_for", None)
        self._token_buckets = token_buckets(min(config.max_cuda_graph_prefill_tokens,
                                                config.scheduler.max_num_batched_tokens))
        self._prefill_splits_by_bucket: dict[int, Optional[int]] = {}
        self._max_model_len = max_model_len
        self.graphs = None
        if device.type == "cuda" and not config.enforce_eager and getattr(backend, "supports_cuda_graphs", False):
            self.graphs = CudaGraphRunner(model, max_bs, max_blocks_per_seq, max_model_len, device,
                                          decode_splits=self._decode_splits,
                                          max_prefill_tokens=self._token_buckets[-1] if self._token_buckets else 0,
                                          max_num_seqs=config.scheduler.max_num_seqs,
                                          prefill_splits=self._prefill_splits,
                                          vocab_size=None if _lm_head_is_parallel(model) else self.vocab_size)
            try:
                self.graphs.capture()
            except Exception as exc:  # noqa: BLE001 - e.g. a collective the NCCL build cannot capture
                logger.warning("CUDA graph capture failed, decode runs eager: %s", exc)
                self.graphs = None
        self.sampler = Sampler()
        self._sampling_metadata = SamplingMetadataCache()  # a decode batch's knobs, made once while it lasts
        self.grammar_masks = GrammarMasks(self.vocab_size, device, config.scheduler.max_num_seqs)
        self.num_deferred_steps = 0  # launched ahead with their masks deferred (tests, benchmarks)
        self._num_grammars = 0  # live states with a grammar: steps without any skip the scan for them
        # What the runner remembers of each request between steps: its sampling row itself, kept and
        # updated in place (output tokens, pending count) rather than rebuilt for every step.
        self._states: dict[str, SamplingRow] = {}
        self.prompt_logprobs = PromptLogprobs(self.vocab_size, device)  # requests still scoring their prompt
        self._last_sampled: tuple[Optional[torch.Tensor], dict[str, int]] = (None, {})

    def _decode_splits(self, bucket: int) -> Optional[int]:
        """Split-K count for decode batches of this bucket: one choice for eager steps and graphs alike."""
        if bucket not in self._splits_by_bucket:
            self._splits_by_bucket[bucket] = None if self._split_policy is None else self._split_policy(
                bucket, self.spec.num_kv_heads, self._max_model_len, self.device)
        return self._splits_by_bucket[bucket]

    def _prefill_splits(self, token_bucket: int) -> Optional[int]:
        """Context-split count of the prefill kernel for steps of this token bucket, eager or graph alike."""
        if token_bucket not in self._prefill_splits_by_bucket:
            attn = self.model.attention_layers()[0]  # this rank's heads under tensor parallelism
            self._prefill_splits_by_bucket[token_bucket] = None if self._prefill_split_policy is None else (
                self._prefill_split_policy(token_bucket, attn.num_heads, attn.num_kv_heads, attn.head_dim,
                                           self.dtype, self._max_model_len, self.device))
        return self._prefill_splits_by_bucket[token_bucket]

    def shutdown(self) -> None:
        """End the structured-output worker thread, if one was made (idempotent)."""
        self.grammar_masks.close()

    def execute(self, scheduler_output: SchedulerOutput) -> RunnerOutput:
        """Run one step and wait for its sampled ids (the synchronous path)."""
        return self.collect(self.launch(scheduler_output))

    def launch(self, scheduler_output: SchedulerOutput, defer_masks: bool = False) -> "_Launched":
        """Enqueue one step's device work without waiting for it (no host sync).

        Placeholder input tokens (sampled by the previous launch, not yet on the host) are filled
        in on the device from that launch's sampled ids. ``defer_masks`` (a step scheduled ahead):
        when the step has rows with a grammar, only its forward is enqueued; ``finish`` samples it.
        """
        return self.run(self.prepare(scheduler_output), defer_masks)

    @torch.inference_mode()
    def prepare(self, scheduler_output: SchedulerOutput) -> "_Prepared":
        """A step's host work and input copies, enqueued but not its forward (``run``). A step scheduled
        ahead of one whose masks are deferred is prepared before that one is sampled (``finish``): its
        placeholder rows are known from that step's launch, and its inputs' copies queue behind it."""
        for request_id in scheduler_output.finished_request_ids:
            state = self._states.pop(request_id, None)
            if state is not None and state.grammar is not None:
                self._num_grammars -= 1
        self.inputs.forget(scheduler_output.finished_request_ids)
        if self.prompt_logprobs:
            self.prompt_logprobs.forget(scheduler_output.finished_request_ids)
        for new in scheduler_output.new_requests:
            self._states[new.request_id] = SamplingRow(
                params=new.sampling_params,
                prompt_token_ids=new.prompt_token_ids,
                output_token_ids=[],
                seed=new.seed,
                eos_token_ids=new.eos_token_ids,
                grammar=new.grammar,
            )
            if new.grammar is not None:
                self._num_grammars += 1
            if new.sampling_params.prompt_logprobs is not None:
                self.prompt_logprobs.add(new)
        self._run_swaps(scheduler_output)
        if scheduler_output.is_empty:
            return _Prepared(None)
        inputs = self.inputs.prepare(scheduler_output.scheduled, self._last_sampled[1],
                                     scheduler_output.num_draft_tokens)
        if inputs.is_decode_only:
            bucket = next((b for b in self._decode_buckets if b >= inputs.attention.num_seqs), None)
            if bucket is not None:
                inputs.attention.decode_num_splits = self._decode_splits(bucket)
        else:
            bucket = next((b for b in self._token_buckets if b >= inputs.attention.num_tokens), None)
            if bucket is not None:
                inputs.attention.prefill_num_splits = self._prefill_splits(bucket)
        prompt_runs = (self.prompt_logprobs.plan(scheduler_output.scheduled, inputs.attention.query_start_loc_cpu)
                       if self.prompt_logprobs else None)
        return _Prepared(inputs, prompt_runs or None)

    @torch.inference_mode()
    def run(self, prepared: "_Prepared", defer_masks: bool = False) -> "_Launched":
        """Enqueue a prepared step's forward and, unless its masks are deferred, its sampling."""
        inputs = prepared.inputs
        if inputs is None:
            return _Launched(None, None, [], [])
        self._fill_placeholders(inputs)
        logits = None  # [num_tokens, vocab] when a decode graph computed them
        if self.graphs is not None and self.graphs.can_run(inputs):
            hidden, logits = self.graphs.run(inputs)
        else:
            with forward_context(inputs.attention):
                hidden = self.model(inputs.input_ids, inputs.positions)
        # Prompt logprobs: their slices go first, while ``hidden`` is this step's (a graph's is overwritten
        # by the next replay); the sampling below queues behind them.
        prompt_pending = (self.prompt_logprobs.compute(self.model, hidden, prepared.prompt_runs)
                          if prepared.prompt_runs else None)
        if not inputs.sampled_request_ids:
            return _Launched(None, None, [], [], prompt_logprobs=prompt_pending)
        if logits is None:
            logits = self.model.compute_logits(hidden[inputs.logits_indices])
        elif len(inputs.sampled_request_ids) != inputs.attention.num_tokens:  # a 1-token prompt chunk is not sampled
            logits = logits[inputs.logits_indices]

        # build reads the rows now and keeps nothing of them, so the live states serve as this step's rows.
        states = [self._states[request_id] for request_id in inputs.sampled_request_ids]
        drafts = inputs.draft_token_ids
        launched = _Launched(None, None, inputs.sampled_request_ids, states, drafts, prompt_logprobs=prompt_pending)
        if (defer_masks and self._num_grammars and drafts is None
                and any(state.grammar is not None for state in states)):
            # Scheduled ahead: the masks need the previous step's tokens, which the engine collects
            # next (``collect(..., masks_of=this)``); ``finish`` then samples this step. What does not
            # need them is done now: the masks' plan, the sampling tensors (a row's noise position is
            # its tokens known or pending, the same now as then), and the row of each request among
            # this step's sampled ids, which the next step's inputs are prepared with.
            launched.logits = logits
            launched.pending_mask = self.grammar_masks.plan(states, tokens_known=False)
            launched.metadata = self._sampling_metadata.build(states, logits.shape[1], self.device)
            launched.sampled_rows = {rid: row for row, rid in enumerate(launched.request_ids)}
            self._last_sampled = (None, launched.sampled_rows)
            self.num_deferred_steps += 1
            return launched
        # Structured outputs: the masks are computed here, with the forward already enqueued.
        mask = self.grammar_masks.fill(states, drafts) if self._num_grammars else None
        self._sample(launched, logits, mask)
        return launched

    @torch.inference_mode()
    def finish(self, launched: "_Launched") -> None:
        """Sample a step launched with ``defer_masks`` (its masks applied): before the next launch,
        whose placeholder inputs are this step's sampled ids. No-op for a step already sampled. Masks
        no worker started on (its previous step was not collected with ``masks_of`` it) are computed here."""
        if launched.logits is None:
            return
        logits, launched.logits = launched.logits, None
        mask, launched.pending_mask = self.grammar_masks.finish_fill(launched.pending_mask), None
        self._sample(launched, logits, mask)

    def poll_masks(self, launched: "_Launched") -> bool:
        """A step launched with ``defer_masks``: start its masks' copy if they are computed (never
        waits). True when ``finish`` would not wait for them (or has nothing left to do)."""
        return launched.logits is None or self.grammar_masks.poll(launched.pending_mask)

    def _sample(self, launched: "_Launched", logits: torch.Tensor, mask: "Optional[StepMask]") -> None:
        states, drafts = launched.states, launched.drafts
        if launched.metadata is not None:
            metadata = launched.metadata
        elif drafts is None:
            metadata = self._sampling_metadata.build(states, logits.shape[1], self.device)
        else:
            rows, offsets = _verification_rows(states, drafts)
            metadata = SamplingMetadata.build(rows, logits.shape[1], self.device, row_offsets=offsets)
        if mask is None:
            result = self.sampler(logits, metadata)
        else:
            launched.grammar_states, launched.grammar_matchers = mask.grammar_states, mask.matchers
            if mask.rows is None and MaskedGreedy.applies(logits, metadata):  # every row masked, plain argmax
                result = SamplerOutput(sampled_token_ids=masked_greedy(logits, mask.bits))
            else:
                result = self.sampler(self.grammar_masks.apply(logits, mask), metadata)
        for state in states:
            state.num_pending_tokens += 1
        # No step is launched ahead of one with drafts (the engine waits for its accepted tokens), so
        # its sampled rows are never anyone's placeholder input. A step whose masks were deferred
        # made its row map at launch (the step ahead's inputs were prepared with it): reused here.
        if drafts is not None:
            self._last_sampled = (None, {})
        else:
            rows = launched.sampled_rows
            if rows is None:
                rows = {rid: row for row, rid in enumerate(launched.request_ids)}
            self._last_sampled = (result.sampled_token_ids, rows)
        launched.result, launched.ready = _copy_to_host(result)

    def collect(self, launched: "_Launched", masks_of: Optional["_Launched"] = None) -> RunnerOutput:
        """Wait for a launched step's sampled ids: the step's one device-to-host sync.

        ``masks_of``: the step launched after it with ``defer_masks``: once the matchers have taken
        these tokens, a worker thread fills that step's masks (``finish`` waits for them)."""
        assert launched.logits is None, "a step launched with deferred masks is collected after finish"
        prompt_rows = (None if launched.prompt_logprobs is None
                       else self.prompt_logprobs.collect(launched.prompt_logprobs))
        if launched.result is None:
            return RunnerOutput(sampled_request_ids=[], sampled_token_ids=[], prompt_logprobs=prompt_rows)
        if launched.ready is not None:
            # Wait for this step's copy only: a .tolist() on the device tensor would also wait for
            # the step launched after it, which is exactly the overlap async scheduling is for.
            launched.ready.synchronize()
        token_ids: list[int] = launched.result.sampled_token_ids.tolist()
        if launched.drafts is not None:
            verified = _verify(launched, token_ids)
            verified.prompt_logprobs = prompt_rows
            return verified
        live = (live_tokens(launched.grammar_matchers, token_ids, launched.grammar_states)
                if launched.grammar_states else ())
        if masks_of is not None and masks_of.pending_mask is not None and masks_of.pending_mask.job is None:
            # The matchers take these tokens, then the step ahead's masks (which follow them) are
            # computed, both in the worker while the engine goes on (finish waits for them); started
            # first, since the masks are what the next sampling waits for.
            self.grammar_masks.start(masks_of.pending_mask, live)
        elif live:
            self.grammar_masks.advance(live)
        for state, token_id in zip(launched.states, token_ids):
            state.output_token_ids.append(token_id)
            state.num_pending_tokens -= 1
        return RunnerOutput(
            sampled_request_ids=launched.request_ids,
            sampled_token_ids=token_ids,
            logprobs=_logprob_rows(launched.result, launched.states),
            prompt_logprobs=prompt_rows,
        )

    def _run_swaps(self, scheduler_output: SchedulerOutput) -> None:
        """Enqueue the step's KV swaps ahead of its forward (they may come with nothing to compute)."""
        if self.swapper is None:
            if scheduler_output.has_swaps:
                raise RuntimeError("the scheduler asked for KV swaps but the runner has no host pool")
            return
        self.swapper.poll()  # timings of copies that finished meanwhile; never waits
        if scheduler_output.has_swaps:
            self.swapper.swap(scheduler_output.swap_out, scheduler_output.swap_in)

    def take_swap_timings(self) -> list:
        """KV swap copies timed since the last call (``SwapTiming`` records; empty without a host pool)."""
        return self.swapper.take_timings() if self.swapper is not None else []

    def _fill_placeholders(self, inputs: StepInputs) -> None:
        """Inputs that are the token the previous launch sampled: copied on the device (the index came
        with the step's other inputs, in the same host-to-device copy)."""
        sampled = self._last_sampled[0]
        if inputs.placeholder_prefix:
            n = inputs.placeholder_prefix
            inputs.input_ids[:n].copy_(sampled[:n])
        elif inputs.placeholder_index is not None:
            index = inputs.placeholder_index
            inputs.input_ids[index[0]] = sampled[index[1]]


def _lm_head_is_parallel(model: torch.nn.Module) -> bool:
    """Whether the LM head gathers over tensor-parallel ranks (then it stays outside CUDA graphs)."""
    lm_head = getattr(model, "lm_head", None)
    return lm_head is None or getattr(getattr(lm_head, "tp", None), "is_parallel", False)


@dataclass(slots=True)
class _Launched:
    """A step whose device work is enqueued; ``collect`` waits for it."""

    result: Optional[SamplerOutput]  # host (pinned) copies, valid once ``ready`` has completed
    ready: Optional[torch.cuda.Event]  # recorded after the copies; None on CPU (already done)
    request_ids: list[str]
    states: list[SamplingRow]
    drafts: Optional[list[list[int]]] = None  # per request its verified drafts ([] for none); None: no drafts
    grammar_states: Sequence[int] = ()  # indices of ``states`` whose matcher takes the sampled tokens
    grammar_matchers: Sequence = ()  # those matchers, in that order
    logits: Optional[torch.Tensor] = None  # launched with deferred masks: not sampled yet (``finish``)
    pending_mask: Optional["PendingMask"] = None  # its masks, planned; filling from ``collect(..., masks_of=)``
    sampled_rows: Optional[dict] = None  # request id -> row, made at launch when sampling is deferred
    metadata: Optional[SamplingMetadata] = None  # its sampling tensors, built at launch
    prompt_logprobs: Optional[PendingPromptLogprobs] = None  # its prompt-logprob rows, copying to the host


@dataclass(slots=True)
class _Prepared:
    """A step's inputs, copied (or queued to be) but its forward not yet enqueued (``run``); None: nothing to run."""

    inputs: Optional[StepInputs]
    prompt_runs: Optional[list] = None  # prompt-logprob rows to compute after the forward (sample/prompt_logprobs.py)


def _verification_rows(states: list[SamplingRow], drafts: list[list[int]]) -> tuple[list[SamplingRow], list[int]]:
    """A request's d + 1 rows, each sampling as the step without drafts would at its output position:
    the seeded noise of that position (``offsets``: tokens after the request's next one), and, with
    penalties, the drafts before it counted as output (a row of its own with those tokens, whose
    position is then in its output already). min_tokens is behind every drafting request
    (spec_decode/policy.py)."""
    rows: list[SamplingRow] = []
    offsets: list[int] = []
    for state, ds in zip(states, drafts):
        rows.append(state)
        offsets.append(0)
        if not ds:
            continue
        p = state.params
        if p.repetition_penalty != 1.0 or p.frequency_penalty != 0.0 or p.presence_penalty != 0.0:
            rows.extend(dataclasses.replace(state, output_token_ids=state.output_token_ids + ds[:j])
                        for j in range(1, len(ds) + 1))
            offsets.extend([0] * len(ds))
        else:
            rows.extend([state] * len(ds))
            offsets.extend(range(1, len(ds) + 1))
    return rows, offsets


def _verify(launched: _Launched, rows: list[int]) -> RunnerOutput:
    """Verification: a request with drafts d_1..d_k sampled g_1..g_{k+1} (g_j after the known tokens
    and d_1..d_{j-1}: the argmax for greedy rows, else the draw of the seeded noise of g_j's own
    output position); d_j is accepted while it equals g_j, and the tokens are g_1..g_{a+1} for a
    accepted drafts: exactly the tokens k + 1 steps without drafts would have produced, since each
    g_j depends only on the tokens before it and its position's noise. For a sampled request this is
    the optimal lossless test for a deterministic drafter: d_j is accepted with probability p(d_j)."""
    first: list[int] = []
    accepted: dict[int, list[int]] = {}
    logprob_rows = _logprob_rows(launched.result, [s for s, d in zip(launched.states, launched.drafts)
                                                   for _ in range(len(d) + 1)])  # (only params are read)
    logprobs: list[Optional[TokenLogprobs]] = []
    accepted_logprobs: dict[int, list[TokenLogprobs]] = {}
    at = 0
    for row, (state, drafts) in enumerate(zip(launched.states, launched.drafts)):
        sampled = rows[at:at + len(drafts) + 1]
        num_accepted = 0
        while num_accepted < len(drafts) and drafts[num_accepted] == sampled[num_accepted]:
            num_accepted += 1
        first.append(sampled[0])
        if num_accepted:
            accepted[row] = sampled[1:num_accepted + 1]
        if logprob_rows:
            logprobs.append(logprob_rows[at])
            if num_accepted and logprob_rows[at] is not None:
                accepted_logprobs[row] = logprob_rows[at + 1:at + num_accepted + 1]
        at += len(drafts) + 1
        state.output_token_ids.extend(sampled[:num_accepted + 1])
        state.num_pending_tokens -= 1
        if state.grammar is not None:
            _advance(state, sampled[:num_accepted + 1])
    return RunnerOutput(sampled_request_ids=launched.request_ids, sampled_token_ids=first, logprobs=logprobs,
                        accepted_token_ids=accepted, accepted_logprobs=accepted_logprobs or None)


def _advance(state: SamplingRow, token_ids: list[int]) -> None:
    """Structured outputs: the matcher takes the request's new tokens (sampled under its mask, so they
    fit; a failure means a bug, and the matcher's error state then allows EOS only)."""
    if state.grammar.is_stopped():  # complete: only EOS was allowed (and taken, unless ignore_eos)
        return
    if not state.grammar.consume_tokens(token_ids):
        logger.error("structured outputs: the grammar rejected sampled tokens %s: %s", token_ids,
                     state.grammar.get_error())


def _copy_to_host(result: SamplerOutput) -> tuple[SamplerOutput, Optional[torch.cuda.Event]]:
    """Start the device-to-host copies of a step's results into pinned memory; no host sync."""
    if result.sampled_token_ids.device.type != "cuda":
        return result, None

    def host(tensor: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        if tensor is None:
            return None
        # A fresh pinned tensor per step: the host allocator only reuses its pages after the copy
        # recorded on them has finished, so two steps in flight never share a buffer.
        out = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        return out.copy_(tensor, non_blocking=True)

    copied = SamplerOutput(sampled_token_ids=host(result.sampled_token_ids),
                           sampled_logprobs=host(result.sampled_logprobs),
                           sampled_ranks=host(result.sampled_ranks),
                           top_token_ids=host(result.top_token_ids),
                           top_logprobs=host(result.top_logprobs))
    ready = torch.cuda.Event()
    ready.record()
    return copied, ready


def _logprob_rows(result, states: list[SamplingRow]) -> list[Optional[TokenLogprobs]]:
    if result.sampled_logprobs is None:
        return []
    sampled = result.sampled_logprobs.tolist()
    ranks = result.sampled_ranks.tolist()
    num_top = result.top_token_ids.shape[1]
    if num_top > MAX_LOGPROBS:
        # A row asked for the whole vocabulary (-1): the step's top-K is the vocabulary for every row;
        # only the rows that asked are converted, each to what it asked (not batch x vocabulary lists).
        top_ids = top_lps = None
    else:
        top_ids = result.top_token_ids.tolist()
        top_lps = result.top_logprobs.tolist()
    rows: list[Optional[TokenLogprobs]] = []
    for i, state in enumerate(states):
        wanted = state.params.logprobs
        if wanted is None:
            rows.append(None)
            continue
        wanted = num_logprobs(wanted, num_top)
        if top_ids is None:
            row_ids, row_lps = result.top_token_ids[i, :wanted].tolist(), result.top_logprobs[i, :wanted].tolist()
        else:
            row_ids, row_lps = top_ids[i][:wanted], top_lps[i][:wanted]
        rows.append(TokenLogprobs(sampled_logprob=sampled[i], sampled_rank=ranks[i],
                                  top_token_ids=row_ids, top_logprobs=row_lps))
    return rows
