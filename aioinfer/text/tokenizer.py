"""Loads the tokenizer (and its chat template) through transformers, for a folder or a GGUF file."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

logger = logging.getLogger(__name__)

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json")


def load_tokenizer(source, tokenizer_path: Optional[str] = None):
    """Returns a fast transformers tokenizer, or None when the source has none (dummy weights)."""
    from transformers import AutoTokenizer

    if tokenizer_path is not None:
        return AutoTokenizer.from_pretrained(tokenizer_path)
    path = Path(source.path)
    if source.kind == "gguf":
        # transformers rebuilds the tokenizer (and chat template) from the GGUF metadata; a source
        # opened with open_model_source lends it the metadata this load already parsed.
        if getattr(source, "gguf", None) is None:
            return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        from aioinfer.models.gguf_loader import lend_parsed_gguf

        with lend_parsed_gguf(path, source.gguf):
            return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    folder = Path(source.folder)
    if any((folder / name).exists() for name in _TOKENIZER_FILES):
        return AutoTokenizer.from_pretrained(str(folder))
    logger.warning("no tokenizer files in %s: only token-id prompts will work", folder)
    return None
