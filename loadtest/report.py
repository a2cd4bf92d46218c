"""Compact text table (stdout, last) and full JSON results."""

from __future__ import annotations

import datetime as _dt
import json
from pathlib import Path
from typing import Any, Optional, Sequence

from .metrics import Dist, LevelSummary
from .runner import RunConfig, RunResult

try:
    import orjson
except ImportError:  # pragma: no cover
    orjson = None  # type: ignore[assignment]


def _num(x: Optional[float], fmt: str = ".1f") -> str:
    return "-" if x is None else format(x, fmt)


def _dist(d: Dist) -> str:
    if d.count == 0:
        return "-"
    return f"{_num(d.p50)}/{_num(d.p90)}/{_num(d.p99)}"


def format_table(levels: Sequence[LevelSummary]) -> str:
    """One row per level; latencies in ms as p50/p90/p99 (means are in the JSON).

    Every request sent is in a count column (sent = ok + err + 429 + cancel), and a level with any
    request that did not end ok gets a line under the table naming each kind: a run whose latencies
    look fine must not hide the requests that never finished.
    """
    header = ["level", "sent", "ok", "err", "429", "cancel", "req/s", "out tok/s", "goodput",
              "TTFT ms p50/90/99", "TPOT ms p50/90/99", "ITL ms p50/90/99", "E2E ms p50/90/99"]
    rows = []
    for s in levels:
        good = "-" if s.goodput is None else f"{s.goodput:.2f} ({100 * (s.goodput_fraction or 0):.0f}%)"
        rows.append([s.name + (" (interrupted)" if s.interrupted else ""), str(s.num_sent), str(s.num_ok),
                     str(s.num_errors), str(s.num_429), str(s.num_cancelled), f"{s.request_throughput:.2f}",
                     f"{s.output_throughput:.1f}", good, _dist(s.ttft), _dist(s.tpot), _dist(s.itl),
                     _dist(s.e2e)])
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
    lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
             for r in [header] + rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for s in levels:
        if s.errors:  # cancelled, rate_limited, http_503, stream_error, exception ...
            kinds = ", ".join(f"{kind} {n}" for kind, n in s.errors.items())
            lines.append(f"{s.name}: {s.num_sent - s.num_ok} of {s.num_sent} not ok: {kinds}")
    return "\n".join(lines)


def results_json(cfg: RunConfig, result: RunResult, *, argv: Sequence[str],
                 started: _dt.datetime, include_requests: bool = True) -> dict[str, Any]:
    wl = cfg.workload
    return {
        "command": list(argv),
        "date": started.isoformat(timespec="seconds"),
        "url": cfg.url,
        "model": cfg.model,
        "endpoint": cfg.endpoint,
        "interrupted": result.interrupted,
        "error": result.error,
        "config": {
            "concurrency": list(cfg.concurrency), "request_rates": list(cfg.request_rates),
            "num_requests": cfg.num_requests, "duration": cfg.duration,
            "max_concurrency": cfg.max_concurrency, "prompt_len": str(wl.prompt_len),
            "output_len": str(wl.output_len), "text_prompts": wl.text_prompts,
            "vocab_size": wl.vocab_size, "seed": wl.seed, "ignore_eos": cfg.ignore_eos,
            "slo_ttft_ms": cfg.slo_ttft_ms, "slo_tpot_ms": cfg.slo_tpot_ms,
            "retry_429": cfg.retry_429, "warmup": cfg.warmup, "wait_ready": cfg.wait_ready, "extra_body": cfg.extra_body,
        },
        "units": {"latencies": "ms in summaries, s in per-request records",
                  "throughput": "per second of level wall time"},
        "levels": [
            {"summary": lv.summary.to_json(),
             **({"requests": [r.to_json() for r in lv.records]} if include_requests else {})}
            for lv in result.levels
        ],
    }


def write_json(path: str | Path, data: dict) -> None:
    path = Path(path)
    if orjson is not None:
        path.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2))
    else:
        path.write_text(json.dumps(data, indent=2))
