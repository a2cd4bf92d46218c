"""vLLM's ``EngineArgs`` / ``AsyncEngineArgs``: the model and the engine's keyword arguments, and the
command-line flags for them, so that scripts written against vLLM (``EngineArgs.add_cli_args(parser)``,
then ``LLM(**vars(args))``) run with the import changed.

The flags are the ones ``aioinfer serve`` takes for the engine (``--max-model-len``, ``-tp``,
``--enforce-eager`` / ``--no-enforce-eager``, ...), built from the same declarations (option_flags.py),
plus ``--model``. An option not given is left out of the parsed namespace altogether
(``argparse.SUPPRESS``), so ``LLM(**vars(args))`` keeps the engine's own default for it. vLLM's
options that mean nothing here are accepted or refused by ``LLM`` itself (aioinfer/vllm_options.py),
not by the parser.
"""

from __future__ import annotations

import argparse
from typing import Any, Optional

from aioinfer.option_flags import add_engine_flags, add_model_flag
from aioinfer.server_config import ENGINE_OPTIONS


class EngineArgs:
    """``EngineArgs(model=..., **engine_kwargs)``; ``add_cli_args(parser)`` adds the flags;
    ``from_cli_args(args)`` takes them back."""

    def __init__(self, model: Optional[str] = None, **engine_kwargs: Any) -> None:
        self.model = model
        self.engine_kwargs = engine_kwargs

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        group = parser.add_argument_group("engine")
        add_model_flag(group, default=argparse.SUPPRESS)
        add_engine_flags(group, default=argparse.SUPPRESS)
        return parser

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> "EngineArgs":
        given = vars(args)
        return cls(given.get("model"), **{k: v for k, v in given.items() if k in ENGINE_OPTIONS})

    def kwargs(self) -> dict[str, Any]:
        """``LLM(**engine_args.kwargs())``."""
        return ({"model": self.model} if self.model is not None else {}) | dict(self.engine_kwargs)


class AsyncEngineArgs(EngineArgs):
    """vLLM's: the same, for ``AsyncLLM.from_engine_args``."""
