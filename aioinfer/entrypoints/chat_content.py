"""A chat message's ``content`` as a chat template takes it: one string.

OpenAI's API lets ``content`` be a string or a list of typed parts
(``[{"type": "text", "text": "..."}]``), and the OpenAI SDKs and LangChain send lists. Chat
templates concatenate ``message['content']`` as a string (a list makes Jinja raise TypeError), and
the models served here read text only. So text parts are joined with "\\n" (vLLM's rule, so that a
conversation renders the same prompt here as there), and any other part (``image_url``,
``input_audio``, ``file``, ...) is refused by its type rather than silently dropped.

Both the server (``protocol.ChatMessage``) and the offline ``LLM.chat`` go through this module, so
the two cannot render a conversation differently.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

TEXT = "text"  # the one part type accepted


class UnsupportedContentPart(ValueError):
    """A content part that is not text; ``part_type`` is its ``type``."""

    def __init__(self, part_type: object, where: str = "content part ") -> None:
        self.part_type = part_type
        super().__init__(f"{where}type {part_type!r} is not supported: this model takes text only "
                         f"(send parts of type {TEXT!r})")


def check_part(part: object, where: str = "content part ") -> None:
    """Raise UnsupportedContentPart if ``part`` is a mapping whose ``type`` is other than text; other
    malformations (no type, no text) are left to the caller, which names them its own way."""
    if isinstance(part, Mapping):
        kind = part.get("type")
        if kind is not None and kind != TEXT:
            raise UnsupportedContentPart(kind, where)


def content_text(content: Any, where: str = "") -> Optional[str]:
    """``content`` as one string: a string as is, text parts joined with "\\n". None stays None (an
    assistant turn that only calls tools). ValueError for anything else, prefixed with ``where``
    (e.g. ``"message 2, "``)."""
    if content is None or isinstance(content, str):
        return content
    if not isinstance(content, (list, tuple)):
        raise ValueError(f"{where}content must be a string or a list of content parts, got {type(content).__name__}")
    texts = []
    for index, part in enumerate(content):
        here = f"{where}content part {index}: "
        if not isinstance(part, Mapping) or "type" not in part:
            raise ValueError(f"{here}a content part must be an object with a 'type'")
        check_part(part, here)
        text = part.get("text")
        if not isinstance(text, str):
            raise ValueError(f"{here}a text part needs a string 'text'")
        texts.append(text)
    return "\n".join(texts)
