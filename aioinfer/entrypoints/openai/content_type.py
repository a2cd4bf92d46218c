"""The routes that take a JSON body accept only ``Content-Type: application/json`` (else 415), as vLLM does.

Why not parse whatever comes: a web page may send ``text/plain`` (or a form type) to any origin
without a CORS preflight, so a server that reads such a body as JSON can be driven by any page
its user visits (a server on localhost or the intranet). ``application/json`` makes the browser
ask first. The media type is compared case-insensitively; parameters (``; charset=utf-8``) are
allowed; a missing header is refused too.
"""

from __future__ import annotations

from typing import Optional

from aioinfer.entrypoints.openai.errors import unsupported_media_type

JSON_MEDIA_TYPE = "application/json"


def is_json(content_type: Optional[str]) -> bool:
    media_type = (content_type or "").split(";", 1)[0].strip().lower()
    return media_type == JSON_MEDIA_TYPE


def require_json(content_type: Optional[str]) -> None:
    """Raise the 415 APIError unless ``content_type`` (the header's value, or None) is JSON."""
    if not is_json(content_type):
        raise unsupported_media_type(content_type)
