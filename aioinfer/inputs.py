"""vLLM's prompt dicts: ``TextPrompt`` ({"prompt": str}) and ``TokensPrompt`` ({"prompt_token_ids": [...]}).

Scripts written for vLLM pass prompts as these dicts (``llm.generate({"prompt_token_ids": ids})``,
``TokensPrompt(prompt_token_ids=ids)``); the engine takes them beside plain strings and id lists.
``cache_salt`` in the dict salts that prompt's prefix-cache blocks, as vLLM's does. Keys that would
change the result but mean nothing here (multi-modal data) are a ValueError naming them, never
silently dropped.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, TypedDict, Union


class TextPrompt(TypedDict, total=False):
    prompt: str  # required
    cache_salt: str


class TokensPrompt(TypedDict, total=False):
    prompt_token_ids: list[int]  # required
    prompt: str  # the text the ids stand for (shown in outputs only)
    cache_salt: str


_TEXT_KEYS = frozenset(TextPrompt.__annotations__)
_TOKENS_KEYS = frozenset(TokensPrompt.__annotations__)
_UNSUPPORTED = ("multi_modal_data", "mm_processor_kwargs", "multi_modal_uuids", "token_type_ids")


def unwrap_prompt(prompt: Any) -> tuple[Union[str, Sequence[int], Any], Optional[str]]:
    """A prompt dict's (string or token ids, cache_salt); anything else comes back as it is, no salt."""
    if not isinstance(prompt, dict):
        return prompt, None
    unsupported = [k for k in _UNSUPPORTED if k in prompt]
    if unsupported:
        raise ValueError(f"prompt fields not supported (text-only models): {unsupported}")
    if "prompt_token_ids" in prompt:
        unknown = sorted(set(prompt) - _TOKENS_KEYS)
        inner = prompt["prompt_token_ids"]
        if isinstance(inner, (str, bytes, dict)):
            raise ValueError("prompt_token_ids must be a list of token ids")
    elif "prompt" in prompt:
        unknown = sorted(set(prompt) - _TEXT_KEYS)
        inner = prompt["prompt"]
        if not isinstance(inner, str):
            raise ValueError("a TextPrompt's prompt must be a string")
    else:
        raise ValueError(f"a prompt dict needs 'prompt' or 'prompt_token_ids', got keys {sorted(prompt)}")
    if unknown:
        raise ValueError(f"unknown prompt fields {unknown}; known: {sorted(_TOKENS_KEYS | _TEXT_KEYS)}")
    salt = prompt.get("cache_salt")
    if salt is not None and (not isinstance(salt, str) or not salt):
        raise ValueError("cache_salt must be a non-empty string")
    return inner, salt
