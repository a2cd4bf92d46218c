"""``hypercorn benchmarks.null_runner_app:app``: the real server with the null runner installed
(benchmarks/null_runner.py), its step time from ``AIOINFER_BENCH_NULL_STEP_MS`` (default 5)."""

import os

from benchmarks import null_runner

null_runner.install(float(os.environ.get("AIOINFER_BENCH_NULL_STEP_MS", "5")) / 1e3)

from aioinfer.app import app  # noqa: E402  (after the runner is patched)

__all__ = ["app"]
