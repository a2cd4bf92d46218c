"""The prompt checks on the request path (C-level passes for plain ints, the per-id test for the
rest) accept and refuse exactly what the per-id rules say."""

from __future__ import annotations

import pytest

from aioinfer.engine.input_processor import InputProcessor
from aioinfer.entrypoints.openai.protocol import check_prompt


class IntLike(int):
    pass


@pytest.mark.parametrize("prompt", [[1, 2, 3], [0], [[1, 2], [3]], [IntLike(4), 5], "text", ["a", "b"]])
def test_valid_prompt_forms(prompt):
    assert check_prompt(prompt) is prompt


@pytest.mark.parametrize("prompt", [[1, True], [True], [1, -1], [-5], [1, 2.0], [[1], []], [[1, False]], [],
                                    [[1], [-2]], [1, "a"], [None]])
def test_invalid_prompt_forms(prompt):
    with pytest.raises(ValueError):
        check_prompt(prompt)


def test_token_id_validation():
    inputs = InputProcessor(None, vocab_size=100, max_model_len=64, eos_token_ids=(0,), seed=0)
    assert inputs.tokenize([0, 99, 5]) == (None, [0, 99, 5])
    assert inputs.tokenize((IntLike(3), 4)) == (None, [3, 4])
    for bad, message in (([1, True], "integers"), ([1, 2.0], "integers"), ([100], r"\[0, 100\)"),
                         ([-1, 3], r"\[0, 100\)")):
        with pytest.raises(ValueError, match=message):
            inputs.tokenize(bad)
    with pytest.raises(ValueError, match="got \\[100, 101\\]"):
        inputs.tokenize([1, 100, 2, 101])  # the message names the offending ids
