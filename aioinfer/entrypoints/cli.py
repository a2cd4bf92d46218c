"""Command line: ``serve`` the OpenAI API, ``fetch`` the default model, ``generate`` or ``chat`` offline.

``generate`` and ``chat`` tell on stderr what they are doing while the model loads (a first start
downloads it; loading alone takes a while on a CPU): a line, then the start-up phases the engine
logs. Ctrl-C ends any command quietly with status 130 (the shell's 128 + SIGINT), and a bad setting
with one ``aioinfer CMD: error: ...`` line: a traceback is for bugs, not for a user's keystroke.

``generate`` and ``chat`` take every engine option ``serve`` takes, as the same flags (``-tp``,
``--speculative-config``, ...), built from the options' declarations (option_flags.py); absent, an
option has its default (no ``AIOINFER_*`` variable applies offline).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import time


def _offline_options() -> tuple:
    """The engine's options ``LLM(...)`` takes, but ``seed``: here ``--seed`` is the sampling seed."""
    from aioinfer.config import engine_options

    return tuple(spec for spec in engine_options() if spec.name != "seed")


def _engine_args(parser: argparse.ArgumentParser) -> None:
    from aioinfer.option_flags import add_flags, add_model_flag

    group = parser.add_argument_group("engine")
    add_model_flag(group, field_defaults=True)
    add_flags(group, _offline_options(), field_defaults=True)


def _sampling_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--seed", type=int, default=None)


def _llm_kwargs(args) -> dict:
    return {"model": args.model, **{spec.name: getattr(args, spec.name) for spec in _offline_options()}}


def _check(args) -> None:
    """ValueError for a bad setting, before anything loads (the LLM would find it only then)."""
    from aioinfer.config import EngineConfig
    from aioinfer.executor.model_setup import check_model_source
    from aioinfer.fetch import DEFAULT_MODEL

    kwargs = _llm_kwargs(args)
    EngineConfig.from_kwargs(kwargs.pop("model") or DEFAULT_MODEL, **kwargs)
    if args.model is not None:
        check_model_source(args.model)


def _params(args):
    from aioinfer import SamplingParams

    return SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                          top_k=args.top_k, seed=args.seed)


def main(argv: list[str] | None = None) -> None:
    try:
        _main(argv)
    except KeyboardInterrupt:
        # A second Ctrl-C during the exit would print the traceback this spares the user.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        sys.stderr.write("\n")  # past the ^C the terminal echoed
        raise SystemExit(130) from None


def _main(argv: list[str] | None) -> None:
    parser = argparse.ArgumentParser(prog="aioinfer", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    from aioinfer.entrypoints.serve_cli import add_serve_parser
    from aioinfer.option_flags import HelpFormatter

    add_serve_parser(sub)
    fetch = sub.add_parser("fetch", help="download the default model (SmolLM2-135M-Instruct) into the cache")
    fetch.add_argument("--cache-dir", default=None)
    for name, text in (("generate", "complete prompts offline"), ("chat", "answer one user message offline")):
        # A one-line usage, as serve's: the full one lists every engine flag
        cmd = sub.add_parser(name, help=text, formatter_class=HelpFormatter,
                             usage="%(prog)s [options] PROMPT [PROMPT ...]  (all options: %(prog)s --help)")
        _engine_args(cmd)
        _sampling_args(cmd)
        cmd.add_argument("prompts", nargs="+")
    args = parser.parse_args(argv)

    if args.command == "serve":
        args.func(args)
        return
    if args.command == "fetch":
        from aioinfer.fetch import fetch_default_model

        print(fetch_default_model(args.cache_dir))
        return
    from aioinfer.entrypoints.startup_checks import name_the_setting
    from aioinfer.fetch import ModelFetchError

    prog = f"aioinfer {args.command}"
    try:  # a user's mistake (a setting, a prompt too long for --max-model-len): one line
        params = _params(args)
        llm = _load(args, prog)
        if args.command == "generate":
            outputs = llm.generate(args.prompts, params)
        else:
            outputs = llm.chat([[{"role": "user", "content": p}] for p in args.prompts], params)
    except ValueError as exc:
        _fail(prog, name_the_setting(str(exc), set(vars(args))), status=2)
    except (FileNotFoundError, ModelFetchError) as exc:  # a model that cannot be read or fetched
        _fail(prog, name_the_setting(str(exc).splitlines()[0], set(vars(args))), status=1)
    # Each answer under what the user typed (for chat, not the templated prompt the model saw)
    for prompt, out in zip(args.prompts, outputs):
        sys.stdout.write(f"--- {prompt!r}\n{out.outputs[0].text}\n")


def _load(args, prog: str):
    """The LLM, saying on stderr what is happening meanwhile: the engine's INFO lines are its
    start-up phases (model resolved or fetched, weights, tokenizer, KV cache), each with its time."""
    from aioinfer import LLM
    from aioinfer.fetch import DEFAULT_MODEL, DEFAULT_MODEL_ALIASES, default_model_path_if_cached
    from aioinfer.models.hub import looks_like_hub_id

    _check(args)
    model = args.model or DEFAULT_MODEL
    if model in DEFAULT_MODEL_ALIASES:
        where = " (downloading it first)" if default_model_path_if_cached() is None else ""
    else:
        where = " (from the Hugging Face hub unless cached)" if looks_like_hub_id(model) else ""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"{prog}: %(message)s"))
    engine_logger, level = logging.getLogger("aioinfer"), logging.getLogger("aioinfer").level
    engine_logger.addHandler(handler)
    engine_logger.setLevel(logging.INFO)
    started = time.perf_counter()
    print(f"{prog}: loading {model}{where} on device {args.device}", file=sys.stderr, flush=True)
    try:
        llm = LLM(**_llm_kwargs(args))
    finally:  # the phases only: generation stays quiet (its warnings still reach stderr)
        engine_logger.removeHandler(handler)
        engine_logger.setLevel(level)
    print(f"{prog}: loaded in {time.perf_counter() - started:.1f} s; generating", file=sys.stderr, flush=True)
    return llm


def _fail(prog: str, message: str, status: int):
    print(f"{prog}: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(status)


if __name__ == "__main__":
    main()
