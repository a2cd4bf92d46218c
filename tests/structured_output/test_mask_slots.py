"""The slots the masks of steps launched ahead live in (structured_output/mask_slots.py): taken in turn, grown
(never shrunk or freed while the engine runs) when a step has more rows than they hold, a slot
taken before the growth still read from its own rows, and on the CPU the rows the apply reads are
the host rows themselves; llguidance's default thread count."""

from __future__ import annotations

import torch

from aioinfer.structured_output.grammar_mask import default_grammar_threads
from aioinfer.structured_output.mask_slots import MaskSlots


def test_slots_alternate_and_a_slot_is_its_own_rows_again_two_takes_later():
    slots = MaskSlots(num_words=5, device=torch.device("cpu"), rows=4)
    first, second, third = slots.take(3), slots.take(4), slots.take(2)
    assert (first.index, second.index, third.index) == (0, 1, 0)
    assert third is first and second.host.data_ptr() != first.host.data_ptr()
    third.host[:2].fill_(7)
    slots.start_copy(third, 2)  # nothing to copy on the CPU
    rows = slots.apply_rows(third, 2)
    assert rows.data_ptr() == third.host.data_ptr() and torch.equal(rows, torch.full((2, 5), 7, dtype=torch.int32))


def test_slots_grow_for_a_larger_step_and_keep_the_outgrown_ones():
    slots = MaskSlots(num_words=3, device=torch.device("cpu"), rows=2)
    small = slots.take(2)
    small.host.fill_(1)
    large = slots.take(5)  # more rows than the slots hold: both made again, at 5 rows
    assert slots.rows == 5 and large.host.shape == (5, 3)
    # A step in flight that took the small slot still copies and reads the rows the worker wrote.
    assert torch.equal(slots.apply_rows(small, 2), torch.ones((2, 3), dtype=torch.int32))
    again = slots.take(9)
    assert slots.rows == 10  # twice the rows when that is more than the step needs
    assert again.host.shape == (10, 3)
    slots.close()
    slots.close()  # idempotent


def test_default_grammar_threads_are_half_the_cpus_at_most_four():
    assert [default_grammar_threads(set(range(n))) for n in (1, 2, 3, 8, 16, 64)] == [1, 1, 1, 4, 4, 4]
    assert 1 <= default_grammar_threads(None) <= 4
