"""What attention needs to know about one step's flat batch of tokens (built once per step)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch


@dataclass(slots=True)
class AttentionMetadata:
    """Layout of a step: sequences laid end to end, each with its queries and its paged context.

    Sequence ``i`` owns query tokens ``query_start_loc[i]:query_start_loc[i+1]`` of the flat batch;
    those are the last ``query_len`` positions of a context of ``seq_lens[i]`` tokens whose KV lives
    in the blocks ``block_tables[i, :cdiv(seq_lens[i], block_size)]``. Queries attend causally.
    """

    slot_mapping: torch.Tensor  # [num_tokens] int64: block_id * block_size + offset for each new token's KV
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32: cumulative query lengths
    seq_lens: torch.Tensor  # [num_seqs] int32: context length after this step (computed + new tokens)
    block_tables: torch.Tensor  # [num_seqs, max_blocks_per_seq] int32, rows padded with 0
    num_seqs: int
    num_tokens: int
    max_query_len: int  # tokens
    max_seq_len: int  # tokens
    # Host copies of the two small per-sequence vectors, so that CPU code never syncs on the device.
    query_start_loc_cpu: list[int]
    seq_lens_cpu: list[int]
    # Decode-only steps: the split-K count the runner fixed for this batch-size bucket, so that eager
    # steps and CUDA-graph replays run the very same reduction (identical tokens). None: backend's choice.
    decode_num_splits: Optional[int] = None
    # Other steps: the context-split count of the prefill kernel, fixed per CUDA-graph token bucket
    # for the same reason (eager steps that fit a bucket use it too). None: chosen from max_seq_len.
    prefill_num_splits: Optional[int] = None
