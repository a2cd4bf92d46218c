"""One PNG of a load test: TTFT and ITL distributions, and throughput, per level.

    python -m loadtest.loadtest ... --plot run.png          # after the run
    python -m loadtest.plot loadtest-results.json run.png   # later, from --out's JSON

Four panels: the empirical CDF of TTFT per level, the CDF of inter-token (inter-chunk) latency
per level (pooled over the level's ok requests), output tokens/s per level (bars) with ok
requests/s and goodput on a second axis, and TTFT / ITL p50 and p99 per level. Levels are the
concurrency levels and request rates of the run, in run order. matplotlib is an optional extra
(``pip install 'aioinfer[plot]'``), imported only when a plot is drawn; drawing uses the Agg
canvas directly (no pyplot, no interactive backend, no global figure state).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from .client import OK

INSTALL_HINT = "pip install 'aioinfer[plot]'"


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed."""


@dataclass(slots=True)
class LevelData:
    """What one panel set needs from a level; latencies in ms."""

    name: str  # "c16", "rate=4"
    mode: str  # "closed" or "poisson"
    concurrency: Optional[int] = None
    request_rate: Optional[float] = None
    ttft_ms: list[float] = field(default_factory=list)  # one per ok request with a first token
    itl_ms: list[float] = field(default_factory=list)  # pooled gaps of the ok requests
    output_throughput: float = 0.0  # tok/s
    request_throughput: Optional[float] = None  # ok req/s
    goodput: Optional[float] = None  # req/s meeting the SLOs; None without SLOs
    num_ok: int = 0
    num_failed: int = 0  # errors + 429s (cancelled requests are not counted)
    interrupted: bool = False

    @property
    def label(self) -> str:
        if self.mode == "poisson" and self.request_rate is not None:
            cap = "" if self.concurrency is None else f" (cap {self.concurrency})"
            text = f"{self.request_rate:g} req/s{cap}"
        elif self.concurrency is not None:
            text = f"concurrency {self.concurrency}"
        else:
            text = self.name
        return text + (" (interrupted)" if self.interrupted else "")

    @property
    def tick(self) -> str:
        if self.mode == "poisson" and self.request_rate is not None:
            text = f"{self.request_rate:g}"
        elif self.concurrency is not None:
            text = str(self.concurrency)
        else:
            text = self.name
        return text + ("*" if self.interrupted else "")


def _level(summary: Any, records: Sequence[Any]) -> LevelData:
    """From a LevelSummary-like mapping or object and RequestRecord-like records."""
    get = summary.get if isinstance(summary, dict) else (lambda k, d=None: getattr(summary, k, d))
    ok = [r for r in records if _field(r, "status") == OK]
    ttft = [_field(r, "ttft") for r in ok]
    return LevelData(
        name=get("name", "?"), mode=get("mode", "closed"), concurrency=get("concurrency"),
        request_rate=get("request_rate"),
        ttft_ms=[1e3 * t for t in ttft if t is not None],
        itl_ms=[1e3 * x for r in ok for x in (_field(r, "itl") or ())],
        output_throughput=float(get("output_throughput", 0.0) or 0.0),
        request_throughput=get("request_throughput"), goodput=get("goodput"),
        num_ok=len(ok),
        num_failed=int(get("num_errors", 0) or 0) + int(get("num_429", 0) or 0),
        interrupted=bool(get("interrupted", False)))


def _field(rec: Any, name: str) -> Any:
    return rec.get(name) if isinstance(rec, dict) else getattr(rec, name, None)


def levels_from_result(levels: Sequence[Any]) -> list[LevelData]:
    """From ``RunResult.levels`` (``LevelResult``: a summary and its request records)."""
    return [_level(lv.summary, lv.records) for lv in levels]


def levels_from_json(data: dict) -> list[LevelData]:
    """From the ``--out`` JSON; needs its per-request records (not ``--no-per-request``)."""
    levels = data.get("levels", [])
    if any("requests" not in lv for lv in levels):
        raise ValueError("the results have no per-request records (run without --no-per-request)")
    return [_level(lv["summary"], lv["requests"]) for lv in levels]


def _import_matplotlib():
    try:
        import matplotlib  # noqa: F401  (first: a hidden or missing package fails here)
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise PlotUnavailable(f"plotting needs matplotlib, which is not installed: "
                              f"{INSTALL_HINT}") from exc
    return Figure, FigureCanvasAgg


def check_available() -> None:
    """Raise :class:`PlotUnavailable` now rather than after a long run."""
    _import_matplotlib()


def _cdf(ax, values: Sequence[float], color, label: str) -> None:
    a = np.sort(np.asarray(values, dtype=np.float64))
    y = np.arange(1, len(a) + 1) / len(a)
    ax.step(a, y, where="post", color=color, label=f"{label} (n={len(a)})", linewidth=1.5)


def _positive_log(ax, values: Sequence[float], axis: str = "x") -> None:
    """Log scale when the samples are positive and span more than a decade."""
    a = np.asarray(values, dtype=np.float64)
    if a.size and a.min() > 0 and a.max() / a.min() > 10:
        (ax.set_xscale if axis == "x" else ax.set_yscale)("log")


def plot_levels(levels: Sequence[LevelData], path: str | Path, *, model: str, endpoint: str,
                url: Optional[str] = None, note: Optional[str] = None, dpi: int = 100) -> Path:
    """Draw the four panels into one PNG at ``path``; returns the path."""
    Figure, FigureCanvasAgg = _import_matplotlib()
    import matplotlib as mpl

    path = Path(path)
    fig = Figure(figsize=(13, 9), dpi=dpi, layout="constrained")
    FigureCanvasAgg(fig)
    (ax_ttft, ax_itl), (ax_tput, ax_pct) = fig.subplots(2, 2)
    cmap = mpl.colormaps["viridis"]
    colors = [cmap(0.85 * i / max(len(levels) - 1, 1)) for i in range(len(levels))]
    where = f" at {url}" if url else ""
    title = f"loadtest: {model}, /v1/{'chat/completions' if endpoint == 'chat' else 'completions'}{where}"
    fig.suptitle(title + (f"\n{note}" if note else ""), fontsize=12)

    modes = {lv.mode for lv in levels}
    xlabel = ("concurrency (closed loop)" if modes == {"closed"} else
              "request rate, req/s (Poisson arrivals)" if modes == {"poisson"} else "level")

    for ax, attr, what in ((ax_ttft, "ttft_ms", "TTFT"), (ax_itl, "itl_ms", "inter-token latency")):
        all_values: list[float] = []
        for lv, color in zip(levels, colors):
            values = getattr(lv, attr)
            if values:
                _cdf(ax, values, color, lv.label)
                all_values.extend(values)
        if all_values:
            _positive_log(ax, all_values)
            ax.legend(fontsize=8, loc="lower right")
        else:
            ax.text(0.5, 0.5, "no samples", ha="center", va="center", transform=ax.transAxes)
        ax.set_xlabel(f"{what} (ms)")
        ax.set_ylabel("fraction of samples ≤ x")
        ax.set_ylim(0, 1.02)
        ax.set_title(f"{what} distribution per level (CDF)")
        ax.grid(True, which="both", alpha=0.3)

    x = np.arange(len(levels))
    ticks = [lv.tick for lv in levels]
    bars = ax_tput.bar(x, [lv.output_throughput for lv in levels], color=colors, alpha=0.85,
                       label="output tok/s")
    for rect, lv in zip(bars, levels):  # the value at the bar's foot (the lines cross its top)
        text = f"{lv.output_throughput:,.0f} tok/s" + (f"\n{lv.num_failed} failed" if lv.num_failed else "")
        ax_tput.annotate(text, (rect.get_x() + rect.get_width() / 2, 0), ha="center",
                         va="bottom", fontsize=8, xytext=(0, 3), textcoords="offset points",
                         bbox=dict(boxstyle="round,pad=0.2", fc="white", ec="none", alpha=0.8))
    ax_tput.set_ylabel("output tokens/s")
    ax_tput.set_xlabel(xlabel)
    ax_tput.set_xticks(x, ticks)
    ax_tput.set_title("throughput per level")
    ax_tput.margins(y=0.15)
    ax_tput.grid(True, axis="y", alpha=0.3)
    handles = [bars]
    if any(lv.request_throughput is not None for lv in levels):
        ax_req = ax_tput.twinx()
        req = [np.nan if lv.request_throughput is None else lv.request_throughput for lv in levels]
        (line,) = ax_req.plot(x, req, "o-", color="tab:red", label="ok requests/s")
        handles.append(line)
        if any(lv.goodput is not None for lv in levels):
            good = [np.nan if lv.goodput is None else lv.goodput for lv in levels]
            (gline,) = ax_req.plot(x, good, "s--", color="tab:orange", label="goodput, req/s")
            handles.append(gline)
        ax_req.set_ylabel("requests/s")
        ax_req.set_ylim(bottom=0)
        ax_req.margins(y=0.15)
    ax_tput.legend(handles=handles, labels=[h.get_label() for h in handles], fontsize=8,
                   loc="upper left")

    def pct(values: list[float], q: float) -> float:
        return float(np.percentile(values, q)) if values else np.nan

    series = (("ttft_ms", "TTFT", "tab:blue"), ("itl_ms", "ITL", "tab:green"))
    plotted: list[float] = []
    for attr, name, color in series:
        for q, style in ((50, "o-"), (99, "^--")):
            ys = [pct(getattr(lv, attr), q) for lv in levels]
            ax_pct.plot(x, ys, style, color=color, label=f"{name} p{q}")
            plotted.extend(y for y in ys if not np.isnan(y))
    if plotted:
        _positive_log(ax_pct, plotted, axis="y")
    ax_pct.set_xticks(x, ticks)
    ax_pct.set_xlabel(xlabel)
    ax_pct.set_ylabel("latency (ms)")
    ax_pct.set_title("TTFT and ITL percentiles per level")
    ax_pct.legend(fontsize=8, ncols=2)
    ax_pct.grid(True, which="both", alpha=0.3)
    if any(lv.interrupted for lv in levels):
        ax_pct.annotate("* interrupted level", (1, -0.12), xycoords="axes fraction", ha="right",
                        fontsize=8)

    fig.savefig(path, format="png", dpi=dpi, pil_kwargs={"optimize": True})
    return path


def plot_results(levels: Sequence[Any], path: str | Path, *, model: str, endpoint: str,
                 url: Optional[str] = None, note: Optional[str] = None) -> Path:
    """Plot ``RunResult.levels`` (what :class:`loadtest.runner.Runner` collected)."""
    return plot_levels(levels_from_result(levels), path, model=model, endpoint=endpoint, url=url,
                       note=note)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.plot",
                                description="Plot a loadtest --out JSON file (with per-request "
                                            "records) as one PNG.")
    p.add_argument("results", help="JSON written by python -m loadtest.loadtest --out")
    p.add_argument("png", help="PNG to write")
    p.add_argument("--note", default=None, help="second title line")
    p.add_argument("--dpi", type=int, default=100, help="pixels per inch (the figure is 13 x 9 in)")
    args = p.parse_args(argv)
    try:
        check_available()
    except PlotUnavailable as exc:
        p.error(str(exc))
    try:
        data = json.loads(Path(args.results).read_text())
        levels = levels_from_json(data)
    except (OSError, ValueError) as exc:
        p.error(f"{args.results}: {exc}")
    plot_levels(levels, args.png, model=data.get("model", "?"),
                endpoint=data.get("endpoint", "completions"), url=data.get("url"), note=args.note,
                dpi=args.dpi)
    print(f"plot written to {args.png}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
