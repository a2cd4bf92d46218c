"""A model runner that computes nothing: each step sleeps a fixed time (the GIL released, like a
wait for the GPU) and samples token 7 for every sampling request.

With it the host's own cost per token (scheduling, hand-over, detokenization, streams, SSE, HTTP)
is what a run measures, on a CPU, in CI-able form. ``install(step_s)`` patches this process's
``ModelRunner``; benchmarks/null_runner_app.py is the real server with it installed.
"""

from __future__ import annotations

import time

NULL_TOKEN = 7


def install(step_s: float) -> None:
    from aioinfer.core.scheduler_output import RunnerOutput
    from aioinfer.worker.model_runner import ModelRunner

    def launch(self, scheduler_output):
        return [item.request_id for item in scheduler_output.scheduled if item.samples]

    def collect(self, request_ids):
        time.sleep(step_s)
        return RunnerOutput(sampled_request_ids=request_ids, sampled_token_ids=[NULL_TOKEN] * len(request_ids))

    ModelRunner.launch = launch
    ModelRunner.collect = collect

