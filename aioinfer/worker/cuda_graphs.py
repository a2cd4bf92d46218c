"""CUDA graphs for decode steps, one per batch-size bucket, and for small prefill or mixed steps,
one per token-count bucket.

Small models are launch-bound: a decode step of a 24-layer model is hundreds of kernels, and
replaying a graph costs about a microsecond per kernel instead of several (benchmarks/README.md). So is
any step of a few dozen tokens on a large model: the tail of a prompt after a prefix-cache hit
(32 tokens after 4096 cached ones) takes ~15 ms to launch eagerly on the H200, against ~4 ms of
kernels. Graphs are captured largest first, all in one shared memory pool, over static input buffers.

- Decode: a step with n sequences replays the smallest bucket >= n with the padding rows pointed
  at the null block (slot -1: no KV write; one token of context in block 0). The LM head is in the
  graph too (every decode row samples), writing float32 logits into one buffer that all decode
  graphs share: eagerly it was three launches and a fresh [n, vocab] allocation (77 + 155 MB at
  256 rows of Qwen2.5) every step, with ``n`` changing as requests finish.
- Prefill / mixed ("token" graphs): a step of T tokens in S sequences replays the smallest token
  bucket T_b >= T. The graph's prefill-attention launch is sized for T_b tokens in S_b = min(T_b,
  max_num_seqs) + 1 sequences; at replay, sequence S takes the T_b - T padding tokens (context:
  themselves, in the null block; no KV write) and sequences S+1 .. S_b-1 are empty, so every row the
  graph computes belongs to some sequence and no program reads past a table.

The attention backend must read every per-sequence value from device tensors (a backend that
reads host lists, like the torch one, cannot be captured; see ``supports_cuda_graphs``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from aioinfer.attention.context import forward_context
from aioinfer.attention.metadata import AttentionMetadata
from aioinfer.worker.input_buffers import StepInputs

logger = logging.getLogger(__name__)


def token_buckets(max_tokens: int) -> list[int]:
    """Token counts to capture prefill / mixed steps at: 16, 32, 64, ... up to ``max_tokens``."""
    sizes = []
    size = 16
    while size < max_tokens:
        sizes.append(size)
        size *= 2
    return sizes + [max_tokens] if max_tokens > 0 else []


def graph_buckets(max_batch_size: int) -> list[int]:
    """Batch sizes to capture: 1, 2, 4, then every 8 (vLLM's spacing), up to ``max_batch_size``."""
    sizes = [b for b in (1, 2, 4) if b <= max_batch_size]
    sizes += list(range(8, max_batch_size + 1, 8))
    if sizes[-1] != max_batch_size:
        sizes.append(max_batch_size)
    return sizes


@dataclass(slots=True)
class GraphInputs:
    """The static buffers every captured graph reads and writes (sized for the largest bucket)."""

    input_ids: torch.Tensor  # [max_tokens] int64
    positions: torch.Tensor  # [max_tokens] int64
    slot_mapping: torch.Tensor  # [max_tokens] int64, -1 on padding rows
    seq_lens: torch.Tensor  # [max_seqs] int32, 1 on decode padding rows
    query_start_loc: torch.Tensor  # [max_seqs + 1] int32, always arange (decode: one token per sequence)
    token_query_start_loc: torch.Tensor  # [max_seqs + 1] int32, token graphs' ragged layout (rewritten each replay)
    block_tables: torch.Tensor  # [max_seqs, max_blocks_per_seq] int32, 0 (null block) on padding rows

    @classmethod
    def allocate(cls, max_tokens: int, max_seqs: int, max_blocks_per_seq: int, device: torch.device) -> "GraphInputs":
        return cls(
            input_ids=torch.zeros(max_tokens, dtype=torch.int64, device=device),
            positions=torch.zeros(max_tokens, dtype=torch.int64, device=device),
            slot_mapping=torch.full((max_tokens,), -1, dtype=torch.int64, device=device),
            seq_lens=torch.ones(max_seqs, dtype=torch.int32, device=device),
            query_start_loc=torch.arange(max_seqs + 1, dtype=torch.int32, device=device),
            token_query_start_loc=torch.zeros(max_seqs + 1, dtype=torch.int32, device=device),
            block_tables=torch.zeros(max_seqs, max_blocks_per_seq, dtype=torch.int32, device=device),
        )


class CudaGraphRunner:
    def __init__(self, model: torch.nn.Module, max_batch_size: int, max_blocks_per_seq: int, max_model_len: int,
                 device: torch.device, decode_splits: Callable[[int], Optional[int]],
                 max_prefill_tokens: int = 0, max_num_seqs: int = 1,
                 prefill_splits: Optional[Callable[[int], Optional[int]]] = None,
                 vocab_size: Optional[int] = None) -> None:
        self.model = model
        # Decode graphs compute the logits too when the vocabulary size is given (the model's
        # ``compute_logits(hidden, out)``); a tensor-parallel LM head (an all-gather) stays eager.
        self.vocab_size = vocab_size
        self.device = device
        self.decode_splits = decode_splits  # batch-size bucket -> split-K count (shared with eager steps)
        self.prefill_splits = prefill_splits or (lambda _tokens: None)  # token bucket -> context splits
        self.buckets = graph_buckets(max_batch_size)
        self.token_buckets = token_buckets(max_prefill_tokens)
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        max_tokens = max(self.buckets[-1], self.token_buckets[-1] if self.token_buckets else 0)
        max_seqs = max(self.buckets[-1], max((self.token_seqs(t) for t in self.token_buckets), default=0))
        self.inputs = GraphInputs.allocate(max_tokens, max_seqs, max_blocks_per_seq, device)
        self.logits = (torch.empty(self.buckets[-1], vocab_size, dtype=torch.float32, device=device)
                       if vocab_size else None)  # decode graphs' logits: rows [:bucket] after a replay
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._token_graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.num_replays = {"decode": 0, "tokens": 0}  # steps served by each kind of graph (tests, logs)

    def token_seqs(self, num_tokens: int) -> int:
        """Sequences a token bucket's graph is laid out for: every real one plus one for the padding."""
        return min(num_tokens, self.max_num_seqs) + 1

    def metadata(self, batch_size: int) -> AttentionMetadata:
        """Capture-time metadata: device tensors are the static buffers; bounds are the largest allowed."""
        buf = self.inputs
        return AttentionMetadata(
            slot_mapping=buf.slot_mapping[:batch_size],
            query_start_loc=buf.query_start_loc[:batch_size + 1],
            seq_lens=buf.seq_lens[:batch_size],
            block_tables=buf.block_tables[:batch_size],
            num_seqs=batch_size,
            num_tokens=batch_size,
            max_query_len=1,
            max_seq_len=self.max_model_len,  # a bound: kernels read the true lengths from seq_lens
            query_start_loc_cpu=list(range(batch_size + 1)),
            seq_lens_cpu=[1] * batch_size,  # never valid at replay; graph-capable backends must not read it
            decode_num_splits=self.decode_splits(batch_size),
        )

    def token_metadata(self, num_tokens: int) -> AttentionMetadata:
        """Capture-time metadata of a token bucket (ragged sequences; bounds are the largest allowed)."""
        buf, num_seqs = self.inputs, self.token_seqs(num_tokens)
        return AttentionMetadata(
            slot_mapping=buf.slot_mapping[:num_tokens],
            query_start_loc=buf.token_query_start_loc[:num_seqs + 1],
            seq_lens=buf.seq_lens[:num_seqs],
            block_tables=buf.block_tables[:num_seqs],
            num_seqs=num_seqs,
            num_tokens=num_tokens,
            max_query_len=num_tokens,  # > 1: the prefill kernel, whatever the replayed mix
            max_seq_len=self.max_model_len,
            query_start_loc_cpu=[0] + [num_tokens] * num_seqs,  # never valid at replay (see above)
            seq_lens_cpu=[num_tokens] + [0] * (num_seqs - 1),
            prefill_num_splits=self.prefill_splits(num_tokens),
        )

    @torch.inference_mode()
    def capture(self) -> None:
        started = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        # torch.cuda.graph's default capture stream is one per process, made on whichever device was
        # current at the first capture: a second data-parallel replica (cuda:1) would capture on
        # cuda:0's stream, and Triton then sees foreign pointers. Each runner brings its own.
        self._capture_stream = torch.cuda.Stream(device=self.device)
        buf = self.inputs
        # Largest first, token graphs (the biggest activations) before decode: later graphs reuse the memory.
        for num_tokens in reversed(self.token_buckets):
            # A valid layout for the warm-up run: all tokens in sequence 0, reading the null block.
            num_seqs = self.token_seqs(num_tokens)
            buf.token_query_start_loc[1:num_seqs + 1].fill_(num_tokens)
            buf.seq_lens[:num_seqs].fill_(0)
            buf.seq_lens[0].fill_(num_tokens)
            buf.block_tables[:num_seqs].zero_()
            buf.slot_mapping[:num_tokens].fill_(-1)
            self._token_graphs[num_tokens] = self._capture(pool, self.token_metadata(num_tokens), num_tokens)
        buf.seq_lens.fill_(1)
        for batch_size in reversed(self.buckets):
            logits = None if self.logits is None else self.logits[:batch_size]
            self._graphs[batch_size] = self._capture(pool, self.metadata(batch_size), batch_size, logits)
        torch.cuda.synchronize()
        logger.info("CUDA graphs: captured %d for decode batch sizes %s and %d for prefill / mixed steps of up to %s "
                    "tokens in %.2f s", len(self._graphs), self.buckets, len(self._token_graphs), self.token_buckets,
                    time.perf_counter() - started)

    def _capture(self, pool, metadata: AttentionMetadata, num_tokens: int,
                 logits: Optional[torch.Tensor] = None) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """Capture one graph; with ``logits`` (a float32 [num_tokens, vocab] buffer) the LM head too."""
        buf = self.inputs

        def forward() -> torch.Tensor:
            hidden = self.model(buf.input_ids[:num_tokens], buf.positions[:num_tokens])
            if logits is not None:
                self.model.compute_logits(hidden, logits)
            return hidden

        with forward_context(metadata):  # warm-up outside the graph (Triton compiles, cuBLAS plans)
            forward()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool, stream=self._capture_stream), forward_context(metadata):
            hidden = forward()
        return graph, hidden

    def bucket_for(self, num_seqs: int) -> Optional[int]:
        for size in self.buckets:
            if size >= num_seqs:
                return size
        return None

    def token_bucket_for(self, num_tokens: int) -> Optional[int]:
        for size in self.token_buckets:
            if size >= num_tokens:
                return size
        return None

    def can_run(self, inputs: StepInputs) -> bool:
        if inputs.is_decode_only and self.bucket_for(inputs.attention.num_seqs) in self._graphs:
            return True
        return self.token_bucket_for(inputs.attention.num_tokens) in self._token_graphs

    def run(self, inputs: StepInputs) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Replay the step's graph on its inputs; returns hidden states [num_tokens, hidden] and, from
        a decode graph that computes them, float32 logits [num_tokens, vocab] (valid until the next
        decode replay), else None."""
        if inputs.is_decode_only and self.bucket_for(inputs.attention.num_seqs) in self._graphs:
            hidden = self._run_decode(inputs)
            n = inputs.attention.num_seqs
            return hidden, None if self.logits is None else self.logits[:n]
        return self._run_tokens(inputs), None

    def _run_decode(self, inputs: StepInputs) -> torch.Tensor:
        n = inputs.attention.num_seqs
        size = self.bucket_for(n)
        graph, hidden = self._graphs[size]
        buf, meta = self.inputs, inputs.attention
        buf.input_ids[:n].copy_(inputs.input_ids)
        buf.positions[:n].copy_(inputs.positions)
        buf.slot_mapping[:n].copy_(meta.slot_mapping)
        buf.seq_lens[:n].copy_(meta.seq_lens)
        buf.block_tables[:n, :meta.block_tables.shape[1]].copy_(meta.block_tables)
        if size > n:  # padding rows: no KV write, one token of the null block as context
            buf.slot_mapping[n:size].fill_(-1)
            buf.seq_lens[n:size].fill_(1)
            buf.block_tables[n:size, 0].fill_(0)
        graph.replay()
        self.num_replays["decode"] += 1
        return hidden[:n]

    def _run_tokens(self, inputs: StepInputs) -> torch.Tensor:
        meta = inputs.attention
        t, s = meta.num_tokens, meta.num_seqs
        size = self.token_bucket_for(t)
        graph, hidden = self._token_graphs[size]
        buf = self.inputs
        buf.input_ids[:t].copy_(inputs.input_ids)
        buf.positions[:t].copy_(inputs.positions)
        buf.slot_mapping[:t].copy_(meta.slot_mapping)
        buf.seq_lens[:s].copy_(meta.seq_lens)
        buf.block_tables[:s, :meta.block_tables.shape[1]].copy_(meta.block_tables)
        buf.token_query_start_loc[:s + 1].copy_(meta.query_start_loc)
        # Sequence s owns the padding tokens t .. size-1 (context: only themselves, read from the null
        # block, never written); the sequences after it are empty.
        buf.token_query_start_loc[s + 1:self.token_seqs(size) + 1].fill_(size)
        buf.seq_lens[s].fill_(size - t)
        buf.block_tables[s].zero_()
        buf.slot_mapping[t:size].fill_(-1)
        buf.positions[t:size].zero_()
        graph.replay()
        self.num_replays["tokens"] += 1
        return hidden[:t]
