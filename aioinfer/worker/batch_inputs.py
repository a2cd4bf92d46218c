"""Turns a step's scheduled requests into the flat tensors the model and attention read."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from aioinfer.attention.metadata import AttentionMetadata
from aioinfer.core.scheduler_output import ScheduledRequest


@dataclass(slots=True)
class StepInputs:
    input_ids: torch.Tensor  # [num_tokens] int64
    positions: torch.Tensor  # [num_tokens] int64
    attention: AttentionMetadata
    logits_indices: torch.Tensor  # [num_sampled] int64: the last token of each sampling request
    sampled_request_ids: list[str]  # aligned with logits_indices


def build_step_inputs(scheduled: list[ScheduledRequest], block_size: int, device: torch.device) -> StepInputs:
    input_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    query_start_loc = [0]
    seq_lens: list[int] = []
    logits_indices: list[int] = []
    sampled_request_ids: list[str] = []
    for item in scheduled:
        start, count = item.start_position, len(item.token_ids)
        table = item.block_ids
        input_ids.extend(item.token_ids)
        positions.extend(range(start, start + count))
        slots.extend(table[p // block_size] * block_size + p % block_size for p in range(start, start + count))
        query_start_loc.append(query_start_loc[-1] + count)
        seq_lens.append(start + count)
        if item.samples:
            logits_indices.append(query_start_loc[-1] - 1)
            sampled_request_ids.append(item.request_id)

    max_blocks = max(len(item.block_ids) for item in scheduled)
    block_tables = [item.block_ids + [0] * (max_blocks - len(item.block_ids)) for item in scheduled]
    pin = device.type == "cuda"

    def to_device(values: list, dtype: torch.dtype) -> torch.Tensor:
        # Pinned staging + non-blocking copy: the host does not wait for the device here.
        tensor = torch.tensor(values, dtype=dtype, pin_memory=pin)
        return tensor.to(device, non_blocking=True) if pin else tensor

    attention = AttentionMetadata(
        slot_mapping=to_device(slots, torch.int64),
        query_start_loc=to_device(query_start_loc, torch.int32),
        seq_lens=to_device(seq_lens, torch.int32),
        block_tables=to_device(block_tables, torch.int32),
        num_seqs=len(scheduled),
        num_tokens=len(input_ids),
        max_query_len=max(query_start_loc[i + 1] - query_start_loc[i] for i in range(len(scheduled))),
        max_seq_len=max(seq_lens),
        query_start_loc_cpu=query_start_loc,
        seq_lens_cpu=seq_lens,
    )
    return StepInputs(
        input_ids=to_device(input_ids, torch.int64),
        positions=to_device(positions, torch.int64),
        attention=attention,
        logits_indices=to_device(logits_indices, torch.int64),
        sampled_request_ids=sampled_request_ids,
    )
