"""vLLM's ``--root-path``: the app is served behind a proxy under a path prefix (``/llm``).

A proxy may hand requests on with the prefix (``/llm/v1/models``) or strip it (``/v1/models``);
vLLM answers both, and its test of the flag calls both. Quart, given an ASGI ``root_path``, routes
only paths that start with it and answers 404 to the rest, so this middleware puts the prefix in
front of a path that lacks it; Quart then takes it off again, and ``request.root_path`` is the
prefix either way. The prefix comes from the configuration (``AIOINFER_ROOT_PATH`` /
``--root-path``) or, when that is unset, from the server (``hypercorn --root-path``).
"""

from __future__ import annotations

from typing import Optional
from urllib.parse import quote


class RootPath:
    def __init__(self, app, root_path: Optional[str]) -> None:
        self.app = app
        self.root_path = (root_path or "").rstrip("/")  # "/" alone is no prefix at all

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] in ("http", "websocket"):
            root = self.root_path or scope.get("root_path", "").rstrip("/")
            if root:
                scope = _with_prefix(scope, root)
        await self.app(scope, receive, send)


def _with_prefix(scope: dict, root: str) -> dict:
    path = scope["path"]
    if path == root or path.startswith(root + "/"):
        return scope if scope.get("root_path") == root else {**scope, "root_path": root}
    raw_path = scope.get("raw_path")
    return {**scope, "root_path": root, "path": root + path,
            "raw_path": None if raw_path is None else quote(root).encode("ascii") + raw_path}
