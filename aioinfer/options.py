"""Each engine and server option declared once, on the config dataclass field that holds it.

An option used to be spelled in five places (the field, the server's table of variables, ``serve``'s
help and vLLM spellings, ``generate``'s own flags, the docs), and the copies drifted: ``generate``
had no ``-tp``. Now the field's metadata says everything the outside needs (help, the parser of its
text, the values a flag accepts, its bounds, vLLM's other spellings), and the rest is generated from
it: the values' checks (``check_values``, called by the dataclass), the
``AIOINFER_*`` variables (``read_env``), the flags of ``serve``, ``generate`` / ``chat`` and
``EngineArgs`` (option_flags.py), the server's ``ENGINE_OPTIONS``; a test holds docs/server.md's
table to the declarations. Adding an option is one field with ``option(...)`` plus its use.

The value parsers shared by flags and variables (vLLM's ``2k`` / ``32K`` sizes, JSON lists) live here
too, so that config.py can name them without importing the server. This module imports nothing
of aioinfer: it sits under everything that declares options.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Optional

ENV_PREFIX = "AIOINFER_"
_MISSING = dataclasses.MISSING


@dataclass(frozen=True, slots=True)
class Option:
    """What a field's metadata says about it as an option (see ``option``)."""

    help: str  # one line for --help and the docs; the default is added from the field
    parse: Optional[Callable[[str], Any]] = None  # text -> value; None: the field's type (bool, int, float, str)
    choices: Optional[tuple[str, ...]] = None  # the values a flag accepts (argparse checks them up front)
    aliases: tuple[str, ...] = ()  # other flag spellings, vLLM's (-tp)
    name: Optional[str] = None  # the option's name where it is not the field's (speculative_config)
    env: bool = True  # has an AIOINFER_* variable
    flag: bool = True  # has a flag (False: a variable only, e.g. tests only)
    flag_parse: Optional[Callable[[str], Any]] = None  # a flag's stricter parser (the variable's check is the config's)
    multi: bool = False  # the flag takes one value or several (vLLM's nargs "+"); the variable one
    disable_flag: Optional[str] = None  # a bool whose one flag turns it off (--disable-log-requests), no switch
    minimum: Optional[float] = None  # a number's least value (check_values)
    above: Optional[float] = None  # a number must be greater than this
    maximum: Optional[float] = None  # a number's greatest value


def option(default: Any = _MISSING, *, default_factory: Any = _MISSING, **declared: Any) -> Any:
    """A dataclass field declared as an option: ``x: int = option(16, help="...")``."""
    return dataclasses.field(default=default, default_factory=default_factory,
                             metadata={"option": Option(**declared)})


@dataclass(frozen=True, slots=True)
class Spec:
    """An option bound to its field: what flags, variables and the docs are generated from."""

    name: str  # the option's name (a keyword of LLM(...) / Engine(...), a ServerConfig field)
    field: str  # the dataclass field holding it
    owner: type  # the dataclass declaring it
    default: Any  # the field's default (None where it has none or a factory)
    parse: Callable[[str], Any]  # bool, int, float, str or a parser raising ValueError
    option: Option
    kind: Optional[type]  # the value's type from the annotation (bool, int, float, str); None: another

    @property
    def is_bool(self) -> bool:
        return self.parse is bool

    @property
    def env_name(self) -> Optional[str]:
        return env_name(self.name) if self.option.env else None

    @property
    def flags(self) -> tuple[str, ...]:
        """Its flags, the first the main one; () for a variable alone."""
        if not self.option.flag:
            return ()
        if self.option.disable_flag:
            return (self.option.disable_flag,)
        return ("--" + self.name.replace("_", "-"), *self.option.aliases)


_PLAIN_TYPES = {"bool": bool, "int": int, "float": float, "str": str}
_OPTIONAL = re.compile(r"(?:Optional\[)?(\w+)\]?")


@functools.cache
def declared(cls: type) -> tuple[Spec, ...]:
    """The options ``cls`` declares, in field order."""
    specs = []
    for f in dataclasses.fields(cls):
        declared_option = f.metadata.get("option")
        if declared_option is None:
            continue
        match = _OPTIONAL.fullmatch(str(f.type))
        kind = _PLAIN_TYPES.get(match.group(1)) if match else None
        parse = declared_option.parse or kind
        if parse is None:
            raise TypeError(f"{cls.__name__}.{f.name}: type {f.type} needs option(parse=...)")
        default = f.default if f.default is not _MISSING else None
        specs.append(Spec(declared_option.name or f.name, f.name, cls, default, parse, declared_option, kind))
    return tuple(specs)


def check_values(obj: Any) -> None:
    """ValueError naming the option for a declared field whose value its declaration refuses: a bool
    that is not a bool (True, not 1), a number of the wrong type or out of its bounds (minimum, above,
    maximum), a text outside its choices; None only where the default is None. Checks a declaration
    cannot say (a device's form, a folder that must exist) stay in the dataclass's own __post_init__."""
    for spec in declared(type(obj)):
        value = getattr(obj, spec.field)
        if value is None and spec.default is None:
            continue
        if not _allowed(spec, value):
            raise ValueError(f"{spec.name} must be {_expected(spec)}, got {value!r}")


def _allowed(spec: Spec, value: Any) -> bool:
    kind, declared_option = spec.kind, spec.option
    if kind is bool:
        return isinstance(value, bool)
    if kind in (int, float):
        if isinstance(value, bool) or not isinstance(value, (int,) if kind is int else (int, float)):
            return False
        return ((declared_option.minimum is None or value >= declared_option.minimum)
                and (declared_option.above is None or value > declared_option.above)
                and (declared_option.maximum is None or value <= declared_option.maximum))
    if kind is str:
        return isinstance(value, str) and (declared_option.choices is None or value in declared_option.choices)
    return True


def _expected(spec: Spec) -> str:
    """What ``spec`` takes, in words: 'a positive integer', 'an integer in [0, 2]', 'in (0, 1]', 'one of (...)'."""
    declared_option, kind = spec.option, spec.kind
    low, above, high = declared_option.minimum, declared_option.above, declared_option.maximum
    if kind is bool:
        words = "a bool"
    elif kind is str:
        words = f"one of {declared_option.choices}" if declared_option.choices else "a string"
    else:
        if above is not None and high is not None:
            bounds = f"in ({above:g}, {high:g}]"
        elif low is not None and high is not None:
            bounds = f"in [{low:g}, {high:g}]"
        else:
            bounds = " and ".join(f"{sign} {bound:g}" for sign, bound in ((">=", low), (">", above), ("<=", high))
                                  if bound is not None)
        if kind is int:
            words = "a positive integer" if (low == 1 and high is None) else f"an integer {bounds}".rstrip()
        else:
            words = bounds or "a number"
    return words + (" or None" if spec.default is None else "")


def env_name(name: str) -> str:
    return ENV_PREFIX + name.upper()


def read_env(specs: Iterable[Spec], environ: Mapping[str, str]) -> dict[str, Any]:
    """The options set by ``AIOINFER_*`` variables, parsed; ValueError naming the variable."""
    values = {}
    for spec in specs:
        if not spec.option.env:
            continue
        raw = environ.get(spec.env_name)
        if raw is None or raw.strip() == "":
            continue  # an empty variable means "not set", as shells make that easy to produce
        values[spec.name] = parse_text(spec.env_name, raw.strip(), spec.parse)
    return values


def parse_text(setting: str, raw: str, parse: Callable[[str], Any]) -> Any:
    """``raw`` as ``parse`` reads it; ValueError naming ``setting`` (a variable's or flag's name)."""
    if parse not in (bool, int, float, str):  # a parser of its own, with its own message
        try:
            return parse(raw)
        except ValueError as exc:
            raise ValueError(f"{setting}: {exc}") from None
    try:
        if parse is bool:
            return parse_bool(raw)
        return parse(raw)
    except ValueError:
        raise ValueError(f"{setting} must be {parse.__name__}, got {raw!r}") from None


def parse_bool(raw: str) -> bool:
    lowered = raw.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(raw)


# ---------------------------------------------------------------------------- value parsers

def string_list_json(raw: str) -> tuple[str, ...]:
    """``--allowed-origins`` and its siblings: vLLM's JSON list of strings (``'["https://a.example"]'``)."""
    import json

    try:
        value = json.loads(raw)
    except ValueError:
        value = None
    if not (isinstance(value, list) and all(isinstance(item, str) for item in value)):
        raise ValueError(f"expected a JSON list of strings such as '[\"https://app.example\"]', got {raw!r}")
    return tuple(value)


# vLLM's size suffixes: lowercase, powers of 1000 (decimals allowed); uppercase, powers of 1024 (whole numbers)
_DECIMAL_SUFFIXES = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY_SUFFIXES = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def human_readable_int(raw: str) -> int:
    """vLLM's integers for --max-model-len and --max-num-batched-tokens: ``4096``, or with a suffix,
    case-sensitive as vLLM's: ``2k`` = 2000 and ``25.6k`` = 25600 (k, m, g, t: powers of 1000, decimals
    allowed, the product truncated as vLLM's is), ``32K`` = 32768 (K, M, G, T: powers of 1024, whole
    numbers only). ValueError for anything else."""
    if isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    from decimal import Decimal

    text = str(raw).strip()
    number, suffix = text[:-1], text[-1:]
    if suffix in _DECIMAL_SUFFIXES and _is_number(number, decimals=True):
        return int(Decimal(number) * _DECIMAL_SUFFIXES[suffix])  # Decimal: "1.001k" is 1001, not 1000
    if suffix in _BINARY_SUFFIXES and _is_number(number, decimals=False):
        return int(number) * _BINARY_SUFFIXES[suffix]
    if _is_number(text.removeprefix("-"), decimals=False):
        return int(text)
    hint = (f" (decimals only with k, m, g, t: {number}{suffix.lower()} is {number} x 1000)"
            if suffix in _BINARY_SUFFIXES and _is_number(number, decimals=True) else "")
    raise ValueError(f"expected an integer such as 4096, 2k (2000) or 32K (32768), got {raw!r}{hint}")


def context_length(raw: str) -> int:
    """--max-model-len: ``human_readable_int``; vLLM's ``auto`` / ``-1`` (the longest context that fits
    in memory) is refused with what to do instead."""
    if str(raw).strip().lower() in ("auto", "-1"):
        raise ValueError(f"{raw!r} (vLLM: the longest context that fits in memory) is not supported: leave "
                         "the option out for the model's own context length, or give a length")
    return human_readable_int(raw)


def _is_number(text: str, decimals: bool) -> bool:
    whole, _, fraction = text.partition(".") if decimals else (text, "", "")
    return whole.isascii() and whole.isdigit() and (not fraction or (fraction.isascii() and fraction.isdigit()))
