"""Command line: ``serve`` the OpenAI API, ``fetch`` the default model, ``generate`` or ``chat`` offline."""

from __future__ import annotations

import argparse
import sys


def _sized(value: str) -> int:
    """vLLM's sizes (2k = 2000, 32K = 32768), as ``serve`` takes them."""
    from aioinfer.server_config import human_readable_int

    try:
        return human_readable_int(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _engine_args(parser: argparse.ArgumentParser) -> None:
    from aioinfer.config import DTYPE_ALIASES, DTYPES

    parser.add_argument("--model", default=None, help="HF folder, .gguf file, or the default model's name")
    parser.add_argument("--dtype", default="auto", choices=[*DTYPES, *DTYPE_ALIASES])  # vLLM's half, float too
    parser.add_argument("--max-model-len", type=_sized, default=None)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--num-kv-blocks", type=int, default=None)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--max-num-batched-tokens", type=_sized, default=8192)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--cpu-threads", type=int, default=None,
                        help="CPU device: torch intra-op threads (default: torch's, at most the CPUs this process may use)")


def _sampling_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--seed", type=int, default=None)


def _make_llm(args):
    from aioinfer import LLM

    return LLM(model=args.model, dtype=args.dtype, max_model_len=args.max_model_len, block_size=args.block_size,
               num_kv_blocks=args.num_kv_blocks, max_num_seqs=args.max_num_seqs,
               max_num_batched_tokens=args.max_num_batched_tokens, device=args.device, cpu_threads=args.cpu_threads)


def _params(args):
    from aioinfer import SamplingParams

    return SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                          top_k=args.top_k, seed=args.seed)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="aioinfer", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    from aioinfer.entrypoints.serve_cli import add_serve_parser

    add_serve_parser(sub)
    fetch = sub.add_parser("fetch", help="download the default model (SmolLM2-135M-Instruct) into the cache")
    fetch.add_argument("--cache-dir", default=None)
    for name, text in (("generate", "complete prompts offline"), ("chat", "answer one user message offline")):
        cmd = sub.add_parser(name, help=text)
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
    llm = _make_llm(args)
    params = _params(args)
    if args.command == "generate":
        outputs = llm.generate(args.prompts, params)
    else:
        outputs = llm.chat([[{"role": "user", "content": p}] for p in args.prompts], params)
    for out in outputs:
        sys.stdout.write(f"--- {out.prompt!r}\n{out.outputs[0].text}\n")


if __name__ == "__main__":
    main()
