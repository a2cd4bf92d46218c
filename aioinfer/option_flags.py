"""Command-line flags built from the declared options (options.py): ``serve``'s, ``generate`` / ``chat``'s
and vLLM's ``EngineArgs.add_cli_args``, so that one option has the same flag, help and checks everywhere.

A declared option becomes ``--its-name`` plus its aliases (vLLM's ``-tp``; a vLLM name of
vllm_options.RENAMED, ``--swap-space``); a bool becomes a ``--x`` / ``--no-x`` switch; a value is parsed
by the option's parser, a bad one refused by argparse with the parser's one-line message (status 2).
vLLM's engine options that change nothing here or are refused (vllm_options.VLLM_ENGINE_FLAGS) become
flags too, held to the same rules as ``LLM(...)``'s keywords.

Here, below entrypoints/, because ``EngineArgs`` (a library class) needs the engine's flags too.
"""

from __future__ import annotations

import argparse
from typing import Any, Iterable, Optional

from aioinfer.options import Spec, declared
from aioinfer.server_config import ServerConfig, engine_option_specs
from aioinfer.vllm_options import RENAMED, VLLM_ENGINE_FLAGS, refusal


class Switch(argparse.BooleanOptionalAction):
    """``--x`` / ``--no-x``, vLLM's form of a boolean option, taking no value.

    It accepts an optional value only to refuse it: with a plain BooleanOptionalAction,
    ``--enforce-eager false`` would leave ``false`` to argparse as a stray word, reported as
    ``unrecognized arguments: false``; here it names the switch and the two ways to write it.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.nargs = "?"

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        if values is not None:
            raise argparse.ArgumentError(self, f"takes no value (got {values!r}): write {self.option_strings[0]} "
                                               f"or {self.option_strings[1]}")
        super().__call__(parser, namespace, None, option_string)


class _VLLMSwitch(Switch):
    """A switch for one of vLLM's engine options: the value aioinfer would not honour is refused at once
    with vllm_options.py's reason (``--no-enable-chunked-prefill``, ``--enable-lora``)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        super().__call__(parser, namespace, values, option_string)
        why = refusal(self.dest, getattr(namespace, self.dest))
        if why is not None:
            raise argparse.ArgumentError(self, f"{option_string} is not supported: {why}")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    def _format_action_invocation(self, action: argparse.Action) -> str:
        if isinstance(action, Switch):  # no value to show (nargs "?" exists only to refuse one)
            return ", ".join(action.option_strings)
        return super()._format_action_invocation(action)


def checked(typ: Any, *, option: Optional[str] = None):
    """An argparse type from a parser raising ValueError (its message, not "invalid value"); with
    ``option``, the value is also held to vllm_options.py's rule for that vLLM option."""
    def parse(value: str) -> Any:
        try:
            parsed = typ(value)
        except ValueError as exc:
            message = f"invalid {typ.__name__} value: {value!r}" if typ in (int, float) else str(exc)
            raise argparse.ArgumentTypeError(message) from None
        why = refusal(option, parsed) if option is not None else None
        if why is not None:
            raise argparse.ArgumentTypeError(f"{value!r} is not supported: {why}")
        return parsed

    parse.__name__ = getattr(typ, "__name__", "value")
    return parse


def with_default(spec: Spec) -> str:
    """The option's help plus its default (the field's own, so --help never drifts from it) unless
    the text already says it; argparse's %(default)s cannot, as flags default to None (an absent flag
    leaves the AIOINFER_* variable in force)."""
    text, default = spec.option.help, spec.default
    if default is None or spec.option.disable_flag or "(default" in text:
        return text
    shown = default if not isinstance(default, bool) else ("on" if default else "off")
    return f"{text} (default: {shown})"


_VLLM_NAMES = {name: vllm_name for vllm_name, name in RENAMED.items()}


def flags_of(spec: Spec) -> tuple[str, ...]:
    """The option's flags: its own, then vLLM's name for it where vLLM spells it otherwise."""
    if not spec.flags or spec.name not in _VLLM_NAMES:
        return spec.flags
    return (*spec.flags, "--" + _VLLM_NAMES[spec.name].replace("_", "-"))


def add_flags(parser: argparse.ArgumentParser, specs: Iterable[Spec], default: Any = None, *,
              field_defaults: bool = False) -> None:
    """A flag for each option that has one. Absent, it holds ``default`` (None: the AIOINFER_* variable
    stays in force; ``argparse.SUPPRESS``: left out of the namespace), or with ``field_defaults`` the
    field's own default (``generate``, where every option reaches ``LLM(...)``)."""
    for spec in specs:
        if not spec.flags:
            continue  # a variable only (tests only)
        absent = spec.default if field_defaults else default
        if spec.option.disable_flag:
            parser.add_argument(spec.option.disable_flag, dest=spec.name, action="store_const", const=False,
                                default=absent, help=spec.option.help)
        elif spec.is_bool:
            parser.add_argument(*flags_of(spec), dest=spec.name, action=Switch, default=absent,
                                help=with_default(spec))
        else:
            parse = spec.option.flag_parse or spec.parse
            parser.add_argument(*flags_of(spec), dest=spec.name, default=absent, help=with_default(spec),
                                type=parse if parse in (int, float, str) else checked(parse),
                                choices=spec.option.choices, nargs="+" if spec.option.multi else None)


def add_model_flag(parser: argparse.ArgumentParser, default: Any = None, *, field_defaults: bool = False) -> None:
    """``--model``, the server's setting of that name, for the commands that take the engine's flags alone."""
    add_flags(parser, [spec for spec in declared(ServerConfig) if spec.name == "model"], default,
              field_defaults=field_defaults)


def add_engine_flags(parser: argparse.ArgumentParser, default: Any = None) -> None:
    """The engine's options as flags (the engine config's and the async Engine's), each with ``default``
    when absent; and vLLM's engine options that change nothing here or are refused."""
    add_flags(parser, engine_option_specs(), default)
    add_vllm_engine_flags(parser, default)


def add_vllm_engine_flags(parser: argparse.ArgumentParser, default: Any = None) -> None:
    """vLLM's engine options that change nothing here or are refused (vllm_options.VLLM_ENGINE_FLAGS)."""
    for option, (typ, short, text) in VLLM_ENGINE_FLAGS.items():
        flags = ["--" + option.replace("_", "-"), *short]
        text = text or "vLLM's; accepted only at the value that means what aioinfer does"
        if typ is bool:
            parser.add_argument(*flags, dest=option, action=_VLLMSwitch, default=default, help=text)
        elif typ in (int, float, str):
            parser.add_argument(*flags, dest=option, type=checked(typ, option=option), default=default, help=text)
        else:  # a parser of its own, which checks too
            parser.add_argument(*flags, dest=option, type=checked(typ), default=default, help=text)
    # vLLM's dotted form of one key of its JSON option (--structured-outputs-config.backend guidance)
    # (the older flag's option takes it: the same value, and LLM(**vars(args)) knows that name)
    parser.add_argument("--structured-outputs-config.backend", dest="guided_decoding_backend", default=default,
                        type=checked(str, option="guided_decoding_backend"), help="auto or guidance")
