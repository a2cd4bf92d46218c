"""Step inputs packed by InputBuffers.prepare, checked on CPU: placeholder inputs (tokens the previous
launch sampled, async scheduling) are filled from the right sampled row whether the batch kept its
order (the one-copy prefix path) or not (the index that travels with the step's other inputs)."""

from __future__ import annotations

import torch

from aioinfer.core.scheduler import PLACEHOLDER_TOKEN as PH
from aioinfer.core.scheduler_output import ScheduledRequest
from aioinfer.worker.input_buffers import InputBuffers


def _filled(buffers: InputBuffers, scheduled, sampled_rows, sampled_ids):
    """prepare, then what the runner's placeholder fill writes into the input ids."""
    inputs = buffers.prepare(scheduled, sampled_rows)
    ids = inputs.input_ids.clone()
    sampled = torch.tensor(sampled_ids)
    if inputs.placeholder_prefix:
        ids[:inputs.placeholder_prefix] = sampled[:inputs.placeholder_prefix]
    elif inputs.placeholder_index is not None:
        index = inputs.placeholder_index
        ids[index[0]] = sampled[index[1]]
    return inputs, ids.tolist()


def _buffers():
    return InputBuffers(max_num_tokens=64, max_num_seqs=8, max_blocks_per_seq=4, block_size=4,
                        device=torch.device("cpu"))


def test_a_decode_batch_in_its_sampled_order_takes_one_prefix_copy():
    scheduled = [ScheduledRequest(rid, [PH], 5, [1, 2], True) for rid in "abc"]
    inputs, ids = _filled(_buffers(), scheduled, {"a": 0, "b": 1, "c": 2}, [70, 71, 72])
    assert inputs.placeholder_prefix == 3 and inputs.placeholder_index is None
    assert ids == [70, 71, 72]


def test_reordered_finished_and_new_requests_go_through_the_index():
    # "a" finished after the last launch, "d" is new (known input), "c" came before "b".
    scheduled = [ScheduledRequest("c", [PH], 5, [1, 2], True), ScheduledRequest("d", [11], 3, [3], True),
                 ScheduledRequest("b", [PH], 6, [4, 5], True)]
    inputs, ids = _filled(_buffers(), scheduled, {"a": 0, "b": 1, "c": 2}, [70, 71, 72])
    assert inputs.placeholder_prefix == 0 and inputs.placeholder_index is not None
    assert ids == [72, 11, 71]


def test_a_mixed_step_fills_placeholders_inside_multi_token_rows():
    scheduled = [ScheduledRequest("p", [1, 2, 3, 4], 0, [1], False),  # a prompt chunk
                 ScheduledRequest("r", [9, PH], 7, [2, 3, 6], True),  # a resumed request's tail, one in flight
                 ScheduledRequest("s", [PH], 4, [4, 5], True)]
    inputs, ids = _filled(_buffers(), scheduled, {"s": 0, "r": 1}, [50, 51])
    assert not inputs.is_decode_only and inputs.placeholder_index is not None
    assert ids == [1, 2, 3, 4, 9, 51, 50]
    assert inputs.positions.tolist() == [0, 1, 2, 3, 7, 8, 4]


def test_no_placeholders_no_fill():
    scheduled = [ScheduledRequest("a", [5], 2, [1], True), ScheduledRequest("b", [6, 7], 0, [2], True)]
    inputs, ids = _filled(_buffers(), scheduled, {"a": 0}, [99])
    assert inputs.placeholder_prefix == 0 and inputs.placeholder_index is None
    assert ids == [5, 6, 7]
