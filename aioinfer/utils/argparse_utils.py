"""``FlexibleArgumentParser``: vLLM's argument parser, as its example scripts use it.

An ``argparse.ArgumentParser`` that also takes ``--long_option`` spelled with underscores (vLLM's
scripts and users write both) and ``--option=value``; with ``EngineArgs.add_cli_args(parser)`` it
parses the engine's options.
"""

from __future__ import annotations

import argparse
from typing import Optional, Sequence


class FlexibleArgumentParser(argparse.ArgumentParser):
    def parse_known_args(self, args: Optional[Sequence[str]] = None, namespace=None):
        import sys

        given = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args([_dashed(arg) for arg in given], namespace)


def _dashed(arg: str) -> str:
    """``--max_model_len=4`` -> ``--max-model-len=4``; values and short options unchanged."""
    if not arg.startswith("--") or arg == "--":
        return arg
    name, sep, value = arg.partition("=")
    return name.replace("_", "-") + sep + value
