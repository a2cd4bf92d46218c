"""CUDA graphs for decode-only steps, one per batch-size bucket.

Small models are launch-bound: a decode step of a 24-layer model is hundreds of kernels, and
replaying a graph costs about a microsecond per kernel instead of several (BENCHMARKS.md). Graphs
are captured largest bucket first, all in one shared memory pool, over static input buffers; a
step with n sequences replays the smallest bucket >= n with the padding rows pointed at the null
block (slot -1: no KV write; one token of context in block 0).

The attention backend must read every per-sequence value from device tensors (a backend that
reads host lists, like the torch one, cannot be captured; see ``supports_cuda_graphs``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from aioinfer.attention.context import forward_context
from aioinfer.attention.metadata import AttentionMetadata
from aioinfer.worker.input_buffers import StepInputs

logger = logging.getLogger(__name__)


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

    input_ids: torch.Tensor  # [max_bs] int64
    positions: torch.Tensor  # [max_bs] int64
    slot_mapping: torch.Tensor  # [max_bs] int64, -1 on padding rows
    seq_lens: torch.Tensor  # [max_bs] int32, 1 on padding rows
    query_start_loc: torch.Tensor  # [max_bs + 1] int32, always arange (one token per sequence)
    block_tables: torch.Tensor  # [max_bs, max_blocks_per_seq] int32, 0 (null block) on padding rows

    @classmethod
    def allocate(cls, max_bs: int, max_blocks_per_seq: int, device: torch.device) -> "GraphInputs":
        return cls(
            input_ids=torch.zeros(max_bs, dtype=torch.int64, device=device),
            positions=torch.zeros(max_bs, dtype=torch.int64, device=device),
            slot_mapping=torch.full((max_bs,), -1, dtype=torch.int64, device=device),
            seq_lens=torch.ones(max_bs, dtype=torch.int32, device=device),
            query_start_loc=torch.arange(max_bs + 1, dtype=torch.int32, device=device),
            block_tables=torch.zeros(max_bs, max_blocks_per_seq, dtype=torch.int32, device=device),
        )


class CudaGraphRunner:
    def __init__(self, model: torch.nn.Module, max_batch_size: int, max_blocks_per_seq: int, max_model_len: int,
                 device: torch.device, decode_splits: Callable[[int], Optional[int]]) -> None:
        self.model = model
        self.decode_splits = decode_splits  # batch-size bucket -> split-K count (shared with eager steps)
        self.buckets = graph_buckets(max_batch_size)
        self.max_model_len = max_model_len
        self.inputs = GraphInputs.allocate(self.buckets[-1], max_blocks_per_seq, device)
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}

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

    @torch.inference_mode()
    def capture(self) -> None:
        pool = torch.cuda.graph_pool_handle()
        buf = self.inputs
        for batch_size in reversed(self.buckets):  # largest first: later graphs reuse its memory
            metadata = self.metadata(batch_size)
            with forward_context(metadata):  # warm-up outside the graph (Triton compiles, cuBLAS plans)
                self.model(buf.input_ids[:batch_size], buf.positions[:batch_size])
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool), forward_context(metadata):
                hidden = self.model(buf.input_ids[:batch_size], buf.positions[:batch_size])
            self._graphs[batch_size] = (graph, hidden)
        torch.cuda.synchronize()
        logger.info("captured %d CUDA graphs for decode batch sizes %s", len(self._graphs), self.buckets)

    def bucket_for(self, num_seqs: int) -> Optional[int]:
        for size in self.buckets:
            if size >= num_seqs:
                return size
        return None

    def can_run(self, inputs: StepInputs) -> bool:
        return inputs.is_decode_only and self.bucket_for(inputs.attention.num_seqs) in self._graphs

    def run(self, inputs: StepInputs) -> torch.Tensor:
        """Replay the bucket's graph on this step's inputs; returns hidden states [num_seqs, hidden]."""
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
        return hidden[:n]
