"""Hub ids (``Qwen/Qwen2.5-0.5B-Instruct``): fetched with huggingface_hub into its own cache."""

from __future__ import annotations

import re
from pathlib import Path

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_PATTERNS = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.tiktoken", "*.txt"]


def looks_like_hub_id(name: str) -> bool:
    return bool(_HUB_ID.match(name)) and not Path(name).exists()


def download_from_hub(repo_id: str) -> Path:
    """Download config, safetensors and tokenizer files of ``repo_id``; raise FileNotFoundError if it can't."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError as exc:  # pragma: no cover - transformers depends on it
        raise FileNotFoundError(f"{repo_id!r} looks like a hub id but huggingface_hub is not installed") from exc
    try:
        return Path(snapshot_download(repo_id, allow_patterns=_PATTERNS))
    except Exception as exc:  # noqa: BLE001 - offline, unknown repo, gated: one clear message
        # One line (a server prints it as its last word): huggingface_hub's own messages run over several
        reason = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
        raise FileNotFoundError(
            f"model {repo_id!r} is not a local folder or .gguf file, and downloading it from the Hugging Face "
            f"hub failed ({type(exc).__name__}: {reason}); pass a local path, or check the id and the "
            f"network") from exc
