"""Load generator for OpenAI-compatible streaming servers.

    python -m loadtest.loadtest --url http://127.0.0.1:8000 --model NAME \\
        --concurrency 1,16,64,256 --num-requests 256 --prompt-len 100:1024 --output-len 100:1024

    python -m loadtest.loadtest --url ... --model NAME --request-rate 4,8 --duration 60 \\
        --slo-ttft 500 --slo-tpot 50

Progress goes to stderr; the summary table is the last thing on stdout; everything (per-level
summaries and per-request records) goes to ``--out`` as JSON; ``--plot FILE.png`` draws the levels'
TTFT / ITL distributions and throughput (matplotlib: ``pip install 'aioinfer[plot]'``). Ctrl-C
stops the run and still reports what finished.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import sys
from typing import Optional, Sequence

import anyio

from .plot import PlotUnavailable, plot_results
from .plot import check_available as check_plot_available
from .report import format_table, results_json, write_json
from .runner import RunConfig, Runner
from .workload import WorkloadConfig, parse_range


def _int_list(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def _float_list(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(",") if x.strip())


def _have_uvloop() -> bool:
    try:
        import uvloop  # noqa: F401  (a faster event loop: less client-side delay at 256 streams)
    except ImportError:
        return False
    return True


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m loadtest.loadtest", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:8000", help="server base URL")
    p.add_argument("--model", required=True, help="model name sent in each request")
    p.add_argument("--endpoint", choices=("completions", "chat"), default="completions",
                   help="/v1/completions or /v1/chat/completions (chat implies --text-prompts)")
    mode = p.add_argument_group("load")
    mode.add_argument("--concurrency", type=_int_list, default=None,
                      help="closed-loop levels, comma-separated (default 1,16,64,256 "
                           "unless --request-rate is given)")
    mode.add_argument("--request-rate", type=_float_list, default=(),
                      help="open-loop Poisson arrival rates in requests/s, comma-separated")
    mode.add_argument("--max-concurrency", type=int, default=None,
                      help="open loop: cap on in-flight requests (default: none)")
    mode.add_argument("--num-requests", type=int, default=None,
                      help="requests per level (default 256 unless --duration is given)")
    mode.add_argument("--duration", type=float, default=None,
                      help="seconds per level (closed loop: stop starting new requests; "
                           "open loop: last arrival)")
    mode.add_argument("--warmup", type=int, default=0, help="requests sent and discarded first")
    mode.add_argument("--wait-ready", type=float, default=0.0, metavar="S",
                      help="first wait up to S seconds until a 1-token request succeeds")
    wl = p.add_argument_group("workload")
    wl.add_argument("--prompt-len", type=parse_range, default=parse_range("100:1024"),
                    help="prompt tokens (or words), N or LO:HI uniform (default 100:1024)")
    wl.add_argument("--output-len", type=parse_range, default=parse_range("100:1024"),
                    help="max_tokens, N or LO:HI uniform (default 100:1024)")
    wl.add_argument("--text-prompts", action="store_true",
                    help="send text built from a word list instead of random token ids")
    wl.add_argument("--vocab-size", type=int, default=10000,
                    help="random token ids are drawn from [0, N) (default 10000)")
    wl.add_argument("--no-ignore-eos", action="store_true", help="do not send ignore_eos: true")
    wl.add_argument("--extra-body", type=json.loads, default=None,
                    help="JSON object merged into every request body")
    wl.add_argument("--seed", type=int, default=0)
    out = p.add_argument_group("results")
    out.add_argument("--slo-ttft", type=float, default=None, help="goodput SLO: TTFT in ms")
    out.add_argument("--slo-tpot", type=float, default=None, help="goodput SLO: TPOT in ms")
    out.add_argument("--retry-429", type=int, nargs="?", const=3, default=0, metavar="N",
                     help="retry a 429 up to N times (default 3 when given) after Retry-After")
    out.add_argument("--timeout", type=float, default=600.0, help="HTTP timeout in s")
    out.add_argument("--out", default="loadtest-results.json", help="JSON results file")
    out.add_argument("--plot", default=None, metavar="FILE.png",
                     help="also draw TTFT / ITL distributions and throughput per level into a "
                          "PNG (needs matplotlib: pip install 'aioinfer[plot]')")
    out.add_argument("--no-per-request", action="store_true",
                     help="leave per-request records out of the JSON")
    out.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    return p


def config_from_args(args: argparse.Namespace) -> RunConfig:
    concurrency = args.concurrency
    if concurrency is None:
        concurrency = () if args.request_rate else (1, 16, 64, 256)
    num = args.num_requests
    if num is None and args.duration is None:
        num = 256
    text = args.text_prompts or args.endpoint == "chat"
    workload = WorkloadConfig(prompt_len=args.prompt_len, output_len=args.output_len,
                              text_prompts=text, vocab_size=args.vocab_size, seed=args.seed)
    return RunConfig(
        url=args.url, model=args.model, workload=workload, endpoint=args.endpoint,
        concurrency=tuple(concurrency), request_rates=tuple(args.request_rate), num_requests=num,
        duration=args.duration, max_concurrency=args.max_concurrency, slo_ttft_ms=args.slo_ttft,
        slo_tpot_ms=args.slo_tpot, retry_429=args.retry_429, ignore_eos=not args.no_ignore_eos,
        extra_body=args.extra_body, timeout=args.timeout, warmup=args.warmup,
        wait_ready=args.wait_ready)


def main(argv: Optional[Sequence[str]] = None, *, transport=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        cfg = config_from_args(args)
    except ValueError as exc:
        parser.error(str(exc))
    if args.plot is not None:
        try:  # fail before the run, not after it
            check_plot_available()
        except PlotUnavailable as exc:
            parser.error(f"--plot: {exc}")
    started = _dt.datetime.now().astimezone()
    runner = Runner(cfg, transport=transport, verbose=not args.quiet)
    try:
        anyio.run(lambda: runner.run(handle_signals=transport is None),
                  backend_options={"use_uvloop": _have_uvloop()})
    except KeyboardInterrupt:  # a signal that slipped past the receiver: report what finished
        runner.result.interrupted = True
    result = runner.result
    data = results_json(cfg, result, argv=["python", "-m", "loadtest.loadtest", *argv],
                        started=started, include_requests=not args.no_per_request)
    write_json(args.out, data)
    if not args.quiet:
        print(f"results written to {args.out}", file=sys.stderr)
    plot_failed = False
    if args.plot is not None:
        if result.levels:
            try:
                plot_results(result.levels, args.plot, model=cfg.model, endpoint=cfg.endpoint,
                             url=cfg.url)
                if not args.quiet:
                    print(f"plot written to {args.plot}", file=sys.stderr)
            except OSError as exc:
                print(f"error: --plot {args.plot}: {exc}", file=sys.stderr)
                plot_failed = True
        else:
            print("no level finished: no plot written", file=sys.stderr)
    print(format_table([lv.summary for lv in result.levels]), flush=True)
    if result.error is not None or plot_failed:
        return 1
    return 130 if result.interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
