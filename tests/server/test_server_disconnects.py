"""No client can end the engine by leaving: streams cut at every point, by FIN, half-close or RST,
after a stall or not, with speculation on and some requests JSON-constrained.

A stalled client that then hung up killed the engine: the stall probe read the closed socket
and its ``OSError`` escaped into the engine's task group (/health "dead", every request 503).
The stress here is ``loadtest.disconnects`` (the tool's full-size run, 1,000 clients, is in
docs/server.md); the engine's death, once it happens, lasts, so the check after the run decides.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from loadtest import disconnects
from server_process import start_server, wait_idle

SPECULATION = json.dumps({"method": "ngram", "num_speculative_tokens": 4})


@pytest.fixture(scope="module")
def server(smollm2_gguf):
    proc = start_server({"AIOINFER_DEVICE": "cpu", "AIOINFER_DTYPE": "float32", "AIOINFER_MAX_MODEL_LEN": "2048",
                         "AIOINFER_SPECULATIVE_CONFIG": SPECULATION})
    yield proc
    assert proc.stop() == 0, proc.output()
    proc.close_log()


def assert_idle_and_healthy(server) -> None:
    """Nothing runs or waits and the KV cache is free (a bounded wait); then /health is 200."""
    wait_idle(server, timeout=60.0)
    health = httpx.get(server.url + "/health", timeout=30)
    assert health.status_code == 200, health.text
    assert "Traceback" not in server.output(), server.output()[-4000:]


@pytest.mark.slow
def test_clients_that_stall_and_hang_up_anywhere_leave_the_engine_serving(server):
    plans = disconnects.plan_clients(160, seed=7, constrained_share=0.3, stall_share=0.6, max_stall=0.8)
    assert {p.close for p in plans} == {"fin", "rst", "half"} and any(p.constrained for p in plans)
    summary = asyncio.run(disconnects.run(server.url, plans, concurrency=24))
    assert summary.final_ok, summary.final_detail
    assert summary.health_failures == 0, summary
    assert not any(status.startswith("5") for status in summary.refused), summary.refused
    assert summary.completed + sum(summary.cut.values()) + sum(summary.refused.values()) == len(plans), summary
    assert_idle_and_healthy(server)


@pytest.mark.slow
def test_a_cancellation_storm_leaves_the_engine_serving(server):
    # Many streams at once, every one cut early without a stall: aborts arrive in bursts while the
    # speculative and constrained requests around them run.
    for seed in range(2):
        plans = disconnects.plan_clients(96, seed=100 + seed, constrained_share=0.5, stall_share=0.0, max_stall=0.0)
        summary = asyncio.run(disconnects.run(server.url, plans, concurrency=96))
        assert summary.final_ok and summary.health_failures == 0, summary
    assert_idle_and_healthy(server)


def test_an_exchange_that_fails_after_admission_aborts_what_it_admitted():
    # The ASGI server can fail a response after the handler returned (a head it cannot send, a body
    # never iterated): no handler's ``finally`` runs then, and the engine requests must end anyway.
    from aioinfer.entrypoints.openai.shutdown import SCOPE_KEY, EndOpenResponses, OpenResponses

    closed = []

    class Admitted:  # what admit_and_respond puts in the slot (fanout.ChoiceStreams)
        async def close(self):
            closed.append(True)

    async def failing_app(scope, receive, send):
        scope[SCOPE_KEY].streams.append(Admitted())
        raise RuntimeError("the response head could not be sent")

    responses = OpenResponses()
    app = EndOpenResponses(failing_app, responses)
    with pytest.raises(RuntimeError):
        asyncio.run(app({"type": "http"}, None, None))
    assert closed == [True] and len(responses) == 0
