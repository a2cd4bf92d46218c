"""loadtest/: SSE parsing, per-request timing, metrics math, 429s, closed and Poisson loops, JSON.

No real server: an ``httpx.MockTransport`` with an async handler streams controlled SSE bodies.
Exact latencies come from a fake clock that the mock stream advances; nothing asserts wall time.
"""

from __future__ import annotations

import json
import sys
from typing import AsyncIterator, Callable, Optional

import anyio
import httpx
import numpy as np
import pytest

from loadtest.client import (CANCELLED, EXCEPTION, HTTP_ERROR, OK, RATE_LIMITED, STREAM_ERROR,
                             ClientConfig, RequestRecord, chunk_text, iter_sse_data,
                             parse_retry_after, run_request)
from loadtest.loadtest import main
from loadtest.metrics import dist_ms, meets_slo, summarize
from loadtest.report import format_table
from loadtest.runner import RunConfig, Runner
from loadtest.workload import (WorkloadConfig, build_body, iter_specs, parse_range,
                               poisson_arrivals)


@pytest.fixture
def anyio_backend():
    return "asyncio"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, dt: float) -> None:
        self.now += dt


def sse(obj) -> bytes:
    data = obj if isinstance(obj, str) else json.dumps(obj)
    return f"data: {data}\n\n".encode()


def text_chunk(text: str) -> dict:
    return {"choices": [{"index": 0, "text": text}]}


def usage_chunk(completion: int, prompt: int = 7) -> dict:
    return {"choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                                     "total_tokens": prompt + completion}}


def stream_response(events: list, *, clock: Optional[FakeClock] = None,
                    delays: Optional[list[float]] = None, status: int = 200) -> httpx.Response:
    """200 SSE response yielding ``events`` (dicts/strings, or raw bytes); before event i the fake
    clock advances by ``delays[i]``."""

    async def body() -> AsyncIterator[bytes]:
        for i, ev in enumerate(events):
            if clock is not None and delays is not None:
                clock.advance(delays[i])
            yield ev if isinstance(ev, bytes) else sse(ev)
            await anyio.sleep(0)

    return httpx.Response(status, headers={"content-type": "text/event-stream"}, content=body())


def tokens_stream(n: int, *, with_usage: bool = True) -> list:
    events: list = [text_chunk(f" t{i}") for i in range(n)]
    if with_usage:
        events.append(usage_chunk(n))
    events.append("[DONE]")
    return events


async def one(handler: Callable, *, clock=None, cfg=ClientConfig(), known=None, body=None):
    rec = RequestRecord(0)
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler), base_url="http://x") as c:
        await run_request(c, body or {"prompt": [1, 2, 3]}, rec, cfg,
                          clock or FakeClock(), known_prompt_tokens=known)
    return rec


# ------------------------------------------------------------------------------- SSE parsing


async def _lines(items):
    for x in items:
        yield x


@pytest.mark.anyio
async def test_sse_events_comments_multiline_and_missing_final_blank():
    lines = [": keep-alive", "", "data: {\"a\": 1}", "", "event: x", "data:{\"b\": 2}", "",
             "data: line1", "data: line2", "", "id: 3", "data: [DONE]"]
    got = [d async for d in iter_sse_data(_lines(lines))]
    assert got == ['{"a": 1}', '{"b": 2}', "line1\nline2", "[DONE]"]


def test_chunk_text_completions_chat_and_empty():
    assert chunk_text(text_chunk("hi")) == "hi"
    assert chunk_text({"choices": [{"delta": {"content": "yo"}}]}) == "yo"
    assert chunk_text({"choices": [{"delta": {"role": "assistant"}}]}) == ""
    assert chunk_text({"choices": [{"delta": {"content": ""}}]}) == ""
    assert chunk_text(usage_chunk(3)) == ""


def test_parse_retry_after():
    assert parse_retry_after("2", 1.0) == 2.0
    assert parse_retry_after("0.25", 1.0) == 0.25
    assert parse_retry_after(None, 1.5) == 1.5
    assert parse_retry_after("garbage", 1.5) == 1.5
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", 1.0) == 0.0  # a date in the past


# ------------------------------------------------------------------------- one request timing


@pytest.mark.anyio
async def test_exact_ttft_itl_tpot_e2e_with_fake_clock():
    clock = FakeClock()
    # role-only chunk and an empty-text chunk must not count as the first token
    events = [{"choices": [{"delta": {"role": "assistant"}}]}, {"choices": [{"delta": {"content": ""}}]},
              {"choices": [{"delta": {"content": "a"}}]}, {"choices": [{"delta": {"content": "b"}}]},
              {"choices": [{"delta": {"content": "c"}}]}, {"choices": [{"delta": {"content": "d"}}]},
              usage_chunk(4, prompt=11), "[DONE]"]
    delays = [0.050, 0.010, 0.040, 0.020, 0.030, 0.010, 0.005, 0.005]

    async def handler(request: httpx.Request):
        return stream_response(events, clock=clock, delays=delays)

    rec = await one(handler, clock=clock, cfg=ClientConfig(path="/v1/chat/completions"))
    assert rec.status == OK and rec.http_status == 200 and rec.error is None
    assert rec.ttft == pytest.approx(0.100)
    assert rec.itl == pytest.approx([0.020, 0.030, 0.010])
    assert rec.e2e == pytest.approx(0.170)
    assert rec.output_tokens == 4 and rec.usage_reported and rec.prompt_tokens == 11
    assert rec.num_chunks == 4
    assert rec.tpot == pytest.approx((0.170 - 0.100) / 3)


@pytest.mark.anyio
async def test_no_usage_chunk_falls_back_to_counting_chunks():
    async def handler(request):
        return stream_response(tokens_stream(5, with_usage=False))

    rec = await one(handler, known=3)
    assert rec.status == OK and rec.output_tokens == 5 and not rec.usage_reported
    assert rec.prompt_tokens == 3 and len(rec.itl) == 4


@pytest.mark.anyio
async def test_single_token_has_no_tpot():
    async def handler(request):
        return stream_response(tokens_stream(1))

    rec = await one(handler)
    assert rec.status == OK and rec.output_tokens == 1 and rec.tpot is None and rec.itl == []


@pytest.mark.anyio
async def test_error_event_mid_stream_is_a_stream_error():
    async def handler(request):
        return stream_response([text_chunk("a"), text_chunk("b"),
                                {"error": {"message": "engine died", "code": 500}}, "[DONE]"])

    rec = await one(handler)
    assert rec.status == STREAM_ERROR and rec.error == "engine died" and rec.num_chunks == 2


@pytest.mark.anyio
async def test_stream_cut_before_done_and_bad_json():
    async def cut(request):
        return stream_response([text_chunk("a"), text_chunk("b")])

    async def bad(request):
        return stream_response([text_chunk("a"), b"data: {not json\n\n", "[DONE]"])

    rec = await one(cut)
    assert rec.status == STREAM_ERROR and "DONE" in rec.error
    rec = await one(bad)
    assert rec.status == STREAM_ERROR and "bad JSON" in rec.error


@pytest.mark.anyio
async def test_http_error_and_transport_exception():
    async def http500(request):
        return httpx.Response(500, json={"error": {"message": "boom", "type": "server_error"}})

    async def refuse(request):
        raise httpx.ConnectError("connection refused", request=request)

    rec = await one(http500)
    assert rec.status == HTTP_ERROR and rec.http_status == 500 and rec.error == "boom"
    rec = await one(refuse)
    assert rec.status == EXCEPTION and "ConnectError" in rec.error


@pytest.mark.anyio
async def test_429_counted_not_retried_by_default_and_retried_on_request():
    calls = 0

    async def handler(request):
        nonlocal calls
        calls += 1
        if calls <= 2:
            return httpx.Response(429, headers={"Retry-After": "0"},
                                  json={"error": {"message": "overloaded"}})
        return stream_response(tokens_stream(3))

    rec = await one(handler)
    assert rec.status == RATE_LIMITED and rec.retries_429 == 1 and calls == 1
    assert rec.error == "overloaded"

    calls = 0
    rec = await one(handler, cfg=ClientConfig(retry_429=5))
    assert rec.status == OK and rec.retries_429 == 2 and calls == 3 and rec.output_tokens == 3

    calls = 0
    rec = await one(handler, cfg=ClientConfig(retry_429=1))
    assert rec.status == RATE_LIMITED and rec.retries_429 == 2 and calls == 2


# ------------------------------------------------------------------------------ metrics math


def _rec(status=OK, ttft=0.1, itl=(0.01, 0.02), e2e=0.5, out=5, retries=0, http=200):
    return RequestRecord(0, status=status, http_status=http, ttft=ttft, itl=list(itl), e2e=e2e,
                         output_tokens=out, prompt_tokens=10, retries_429=retries)


def test_dist_ms_matches_numpy_percentiles():
    vals = [0.001 * x for x in (5, 1, 9, 3, 7, 2, 100)]
    d = dist_ms(vals)
    ref = np.percentile(np.array(vals) * 1e3, [50, 90, 99])
    assert (d.p50, d.p90, d.p99) == pytest.approx(tuple(ref))
    assert d.mean == pytest.approx(np.mean(vals) * 1e3) and d.count == 7 and d.max == pytest.approx(100)
    assert dist_ms([]).count == 0 and dist_ms([]).p50 is None


def test_tpot_definition_and_goodput():
    fast = _rec(ttft=0.1, e2e=0.5, out=5)  # TPOT 100 ms
    slow_first = _rec(ttft=0.9, e2e=1.0, out=11)  # TPOT 10 ms
    single = _rec(ttft=0.2, e2e=0.2, out=1, itl=())  # no TPOT
    assert fast.tpot == pytest.approx(0.1) and slow_first.tpot == pytest.approx(0.01)
    assert single.tpot is None
    assert meets_slo(fast, 500, 150) and not meets_slo(fast, 500, 50)
    assert not meets_slo(slow_first, 500, None) and meets_slo(slow_first, None, 50)
    assert meets_slo(single, 500, 1)  # no TPOT: any TPOT SLO is met
    assert not meets_slo(_rec(status=STREAM_ERROR), None, None)

    recs = [fast, slow_first, single, _rec(status=RATE_LIMITED, http=429, retries=1),
            _rec(status=HTTP_ERROR, http=503), _rec(status=STREAM_ERROR),
            _rec(status=CANCELLED, e2e=None)]
    recs[0].retries_429 = 2  # ok after two retried 429s
    s = summarize(recs, name="c4", mode="closed", duration_s=2.0, concurrency=4,
                  slo_ttft_ms=500, slo_tpot_ms=50)
    assert (s.num_sent, s.num_ok, s.num_errors, s.num_429, s.num_cancelled) == (7, 3, 2, 1, 1)
    assert s.num_429_responses == 3
    assert s.errors == {"cancelled": 1, "http_503": 1, "rate_limited": 1, "stream_error": 1}
    assert s.output_tokens == 17 and s.output_throughput == pytest.approx(8.5)
    assert s.request_throughput == pytest.approx(1.5)
    assert s.goodput == pytest.approx(0.5) and s.goodput_fraction == pytest.approx(1 / 3)  # single
    assert s.ttft.count == 3 and s.ttft.p50 == pytest.approx(200)
    assert s.tpot.count == 2 and s.tpot.mean == pytest.approx(55)
    assert s.itl.count == 4  # pooled over ok requests
    assert s.e2e.p50 == pytest.approx(500)
    no_slo = summarize(recs, name="c4", mode="closed", duration_s=2.0)
    assert no_slo.goodput is None and no_slo.goodput_fraction is None
    table = format_table([s, no_slo])
    assert "c4" in table and "TTFT" in table and "0.50 (33%)" in table


def test_table_shows_every_request_that_did_not_end_ok():
    """Cancelled and failed requests are in the table, not only in the JSON (issue 56): one count
    column per outcome, summing to the requests sent, and a line per level naming each kind."""
    recs = ([_rec(ttft=0.1, e2e=0.5, out=5)] * 3 + [_rec(status=CANCELLED, e2e=None)] * 16
            + [_rec(status=HTTP_ERROR, http=503), _rec(status=RATE_LIMITED, http=429)])
    clean = summarize([_rec(ttft=0.1, e2e=0.5, out=5)], name="c1", mode="closed", duration_s=1.0)
    lossy = summarize(recs, name="c16", mode="closed", duration_s=2.0, interrupted=True)
    lines = format_table([clean, lossy]).splitlines()
    header = lines[0].split()
    cells = dict(zip(header, lines[3].replace("c16 (interrupted)", "c16").split()))
    assert header[:6] == ["level", "sent", "ok", "err", "429", "cancel"]
    assert [cells[k] for k in header[1:6]] == ["21", "3", "1", "1", "16"]
    assert lines[-1] == "c16: 18 of 21 not ok: cancelled 16, http_503 1, rate_limited 1"
    assert len(lines) == 5  # header, rule, two levels, one note: c1 has nothing to note


# ------------------------------------------------------------------------------- workload


def test_workload_is_seeded_and_in_range():
    cfg = WorkloadConfig(prompt_len=parse_range("5:9"), output_len=parse_range("3"), seed=1,
                         vocab_size=50)
    a = [next(s) for s in [iter_specs(cfg, "x")] for _ in range(20)]
    b = [s for s, _ in zip(iter_specs(cfg, "x"), range(20))]
    assert a == b
    assert a != [s for s, _ in zip(iter_specs(cfg, "y"), range(20))]
    assert all(5 <= len(s.prompt) <= 9 and s.output_len == 3 for s in a)
    assert all(0 <= t < 50 for s in a for t in s.prompt)
    text = next(iter_specs(WorkloadConfig(parse_range("4"), parse_range("2"), text_prompts=True), ""))
    assert isinstance(text.prompt, str) and len(text.prompt.split()) == 4
    body = build_body(text, "m", "chat")
    assert body["messages"] == [{"role": "user", "content": text.prompt}]
    assert body["stream"] and body["stream_options"] == {"include_usage": True}
    assert body["ignore_eos"] is True and body["max_tokens"] == 2 and body["temperature"] == 0.0
    with pytest.raises(ValueError):
        parse_range("9:5")


def test_poisson_arrivals_deterministic():
    a = poisson_arrivals(10.0, seed=3, duration=5.0)
    assert a == poisson_arrivals(10.0, seed=3, duration=5.0)
    assert a != poisson_arrivals(10.0, seed=4, duration=5.0)
    assert all(x < y for x, y in zip(a, a[1:])) and a[-1] < 5.0
    assert 25 <= len(a) <= 80  # seeded, so this never flakes; sanity of the rate
    assert poisson_arrivals(10.0, seed=3, num=7) == a[:7]
    assert len(poisson_arrivals(10.0, seed=3, num=1000, duration=5.0)) == len(a)
    gaps = np.diff(poisson_arrivals(100.0, seed=0, num=20000))
    assert gaps.mean() == pytest.approx(0.01, rel=0.05)


# --------------------------------------------------------------------- closed and open loops


class MockServer:
    """Async handler: streams tokens, tracks concurrency, and fails some requests by call number."""

    def __init__(self, *, fail_429_every=0, error_every=0, retry_after="0") -> None:
        self.calls = 0
        self.running = 0
        self.max_running = 0
        self.bodies: list[dict] = []
        self.fail_429_every = fail_429_every
        self.error_every = error_every
        self.retry_after = retry_after

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        self.calls += 1
        n = self.calls
        body = json.loads(request.content)
        self.bodies.append(body)
        if self.fail_429_every and n % self.fail_429_every == 0:
            return httpx.Response(429, headers={"Retry-After": self.retry_after},
                                  json={"error": {"message": "overloaded"}})
        k = body["max_tokens"]
        if self.error_every and n % self.error_every == 0:
            events = [text_chunk("x"), {"error": {"message": "oops"}}]
        else:
            events = tokens_stream(k)
        server = self

        server.running += 1
        server.max_running = max(server.max_running, server.running)

        async def gen():
            # "running" until the last event is handed over: the client may close the stream
            # right after it, without this generator ever resuming.
            for i, ev in enumerate(events):
                await anyio.sleep(0)
                if i == len(events) - 1:
                    server.running -= 1
                yield sse(ev)

        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=gen())


def _cfg(**kw) -> RunConfig:
    wl = WorkloadConfig(prompt_len=parse_range("4:8"), output_len=parse_range("2:6"), seed=0)
    base = dict(url="http://test", model="m", workload=wl, num_requests=12)
    base.update(kw)
    return RunConfig(**base)


@pytest.mark.anyio
async def test_closed_loop_levels_counts_and_bodies():
    server = MockServer()
    runner = Runner(_cfg(concurrency=(1, 4)), transport=httpx.MockTransport(server), verbose=False)
    result = await runner.run()
    assert [lv.summary.name for lv in result.levels] == ["c1", "c4"]
    for lv in result.levels:
        s = lv.summary
        assert s.num_ok == 12 and s.num_errors == 0 and s.num_429 == 0 and not s.interrupted
        assert s.output_tokens == sum(r.output_tokens for r in lv.records)
        assert all(r.usage_reported and 2 <= r.output_tokens <= 6 for r in lv.records)
        assert all(r.prompt_tokens == 7 for r in lv.records)  # from usage_chunk
        assert s.ttft.count == 12 and s.e2e.count == 12
        assert sorted(r.index for r in lv.records) == list(range(12))
    assert server.max_running <= 4 and server.calls == 24
    b = server.bodies[0]
    assert b["model"] == "m" and b["ignore_eos"] is True and b["temperature"] == 0.0
    assert isinstance(b["prompt"], list) and 4 <= len(b["prompt"]) <= 8
    # each level draws its own prompts (no accidental prefix-cache hits across levels)
    assert [x["prompt"] for x in server.bodies[:12]] != [x["prompt"] for x in server.bodies[12:]]


@pytest.mark.anyio
async def test_closed_loop_duration_mode():
    server = MockServer()
    runner = Runner(_cfg(concurrency=(3,), num_requests=None, duration=0.2),
                    transport=httpx.MockTransport(server), verbose=False)
    result = await runner.run()
    s = result.levels[0].summary
    assert s.num_ok >= 1 and s.num_ok == s.num_sent and server.max_running <= 3


@pytest.mark.anyio
async def test_mixed_failures_are_counted_exactly():
    server = MockServer(fail_429_every=3, error_every=5)
    runner = Runner(_cfg(concurrency=(4,), num_requests=30), transport=httpx.MockTransport(server),
                    verbose=False)
    s = (await runner.run()).levels[0].summary
    # calls 1..30: 429 on multiples of 3 (10), stream error on multiples of 5 not of 3 (4)
    assert (s.num_sent, s.num_429, s.num_errors, s.num_ok) == (30, 10, 4, 16)
    assert s.errors == {"rate_limited": 10, "stream_error": 4}
    assert s.num_429_responses == 10


@pytest.mark.anyio
async def test_retry_429_in_a_level():
    server = MockServer(fail_429_every=2)
    runner = Runner(_cfg(concurrency=(2,), num_requests=10, retry_429=10),
                    transport=httpx.MockTransport(server), verbose=False)
    s = (await runner.run()).levels[0].summary
    assert s.num_ok == 10 and s.num_429 == 0 and s.num_429_responses == server.calls - 10 > 0


@pytest.mark.anyio
async def test_poisson_levels_follow_the_seeded_schedule():
    server = MockServer(fail_429_every=4)
    cfg = _cfg(request_rates=(2000.0, 1000.0), num_requests=None, duration=0.03)
    runner = Runner(cfg, transport=httpx.MockTransport(server), verbose=False)
    expected = [len(runner.arrival_schedule(r)) for r in (2000.0, 1000.0)]
    assert expected == [len(poisson_arrivals(r, 0, None, 0.03, f"poisson/{r:g}")) for r in (2000.0, 1000.0)]
    assert all(n > 5 for n in expected)
    result = await runner.run()
    assert [lv.summary.name for lv in result.levels] == ["rate=2000", "rate=1000"]
    assert [lv.summary.num_sent for lv in result.levels] == expected
    assert sum(lv.summary.num_429 for lv in result.levels) == server.calls // 4
    for lv in result.levels:
        assert lv.summary.mode == "poisson" and lv.summary.request_rate in (2000.0, 1000.0)
        assert lv.summary.num_ok + lv.summary.num_429 == lv.summary.num_sent

    capped = Runner(_cfg(request_rates=(5000.0,), num_requests=20, max_concurrency=2),
                    transport=httpx.MockTransport(server := MockServer()), verbose=False)
    s = (await capped.run()).levels[0].summary
    assert s.num_ok == 20 and server.max_running <= 2


@pytest.mark.anyio
async def test_stop_cancels_inflight_and_keeps_partial_results():
    started = anyio.Event()
    calls = 0

    async def handler(request):
        nonlocal calls
        calls += 1
        if calls <= 5:
            return stream_response(tokens_stream(2))

        async def hang():
            yield sse(text_chunk("a"))
            started.set()
            await anyio.sleep_forever()
            yield b""

        return httpx.Response(200, content=hang())

    runner = Runner(_cfg(concurrency=(1, 8), num_requests=100), transport=httpx.MockTransport(handler),
                    verbose=False)
    async with anyio.create_task_group() as tg:
        tg.start_soon(runner.run)
        with anyio.fail_after(5):
            await started.wait()
        runner.stop()
    result = runner.result
    assert result.interrupted and len(result.levels) == 1  # c8 never ran
    s = result.levels[0].summary
    assert s.interrupted and s.num_ok == 5 and s.num_cancelled == 1 and s.num_errors == 0


# --------------------------------------------------------------------------- CLI and JSON


def test_cli_writes_json_and_prints_table_last(tmp_path, capsys):
    out = tmp_path / "res.json"
    server = MockServer(fail_429_every=4)
    argv = ["--url", "http://mock:1", "--model", "tiny", "--concurrency", "1,2", "--num-requests", "8",
            "--prompt-len", "3:5", "--output-len", "4", "--slo-ttft", "1000", "--slo-tpot", "1000",
            "--seed", "7", "--out", str(out), "-q"]
    assert main(argv, transport=httpx.MockTransport(server)) == 0
    stdout = capsys.readouterr().out.strip().splitlines()
    assert stdout[0].startswith("level") and stdout[-1].startswith("c2")
    data = json.loads(out.read_text())
    assert data["url"] == "http://mock:1" and data["model"] == "tiny" and data["endpoint"] == "completions"
    assert data["command"][-len(argv):] == argv and data["date"] and data["interrupted"] is False
    assert data["config"]["prompt_len"] == "3:5" and data["config"]["seed"] == 7
    assert len(data["levels"]) == 2
    for lv in data["levels"]:
        s = lv["summary"]
        assert s["num_sent"] == 8 == len(lv["requests"])
        assert s["num_ok"] + s["num_429"] == 8 and s["num_429"] == 2
        assert s["goodput"] is not None and s["goodput_fraction"] == 1.0
        assert set(s["ttft"]) == {"count", "mean", "p50", "p90", "p99", "max"}
        ok = [r for r in lv["requests"] if r["status"] == "ok"]
        assert all(r["output_tokens"] == 4 and r["tpot"] is not None and len(r["itl"]) == 3 for r in ok)
    assert all(b["max_tokens"] == 4 and 3 <= len(b["prompt"]) <= 5 for b in server.bodies)


def test_cli_chat_endpoint_uses_text_prompts(tmp_path, capsys):
    seen: list[httpx.Request] = []

    async def handler(request):
        seen.append(request)
        events = [{"choices": [{"delta": {"role": "assistant"}}]}] + [
            {"choices": [{"delta": {"content": "w"}}]} for _ in range(3)] + [usage_chunk(3), "[DONE]"]
        return stream_response(events)

    out = tmp_path / "chat.json"
    rc = main(["--model", "m", "--endpoint", "chat", "--request-rate", "1000", "--num-requests", "5",
               "--prompt-len", "6", "--output-len", "3", "--out", str(out), "-q"],
              transport=httpx.MockTransport(handler))
    assert rc == 0 and len(seen) == 5
    assert all(r.url.path == "/v1/chat/completions" for r in seen)
    body = json.loads(seen[0].content)
    assert len(body["messages"][0]["content"].split()) == 6
    s = json.loads(out.read_text())["levels"][0]["summary"]
    assert s["name"] == "rate=1000" and s["num_ok"] == 5 and s["output_tokens"] == 15


@pytest.mark.anyio
async def test_sigint_stops_the_run_and_keeps_results():
    import os
    import signal

    started = anyio.Event()
    calls = 0

    async def handler(request):
        nonlocal calls
        calls += 1
        if calls <= 3:
            return stream_response(tokens_stream(2))

        async def hang():
            yield sse(text_chunk("a"))
            started.set()
            await anyio.sleep_forever()
            yield b""

        return httpx.Response(200, content=hang())

    runner = Runner(_cfg(concurrency=(1,), num_requests=100), transport=httpx.MockTransport(handler),
                    verbose=False)
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: runner.run(handle_signals=True))
        with anyio.fail_after(5):
            await started.wait()
        os.kill(os.getpid(), signal.SIGINT)  # the watcher task is long since installed
    s = runner.result.levels[0].summary
    assert runner.result.interrupted and s.interrupted and (s.num_ok, s.num_cancelled) == (3, 1)


def test_wait_ready_polls_until_the_server_answers(tmp_path, capsys):
    calls = 0

    async def handler(request):
        nonlocal calls
        calls += 1
        if calls <= 2:
            return httpx.Response(503, json={"error": {"message": "loading"}})
        return stream_response(tokens_stream(json.loads(request.content)["max_tokens"]))

    out = tmp_path / "r.json"
    argv = ["--model", "m", "--concurrency", "2", "--num-requests", "4", "--output-len", "2",
            "--prompt-len", "3", "--wait-ready", "0.5", "--warmup", "2", "--out", str(out), "-q"]
    assert main(argv, transport=httpx.MockTransport(handler)) == 0
    assert calls == 3 + 2 + 4  # 2 not ready + 1 ready, warmup, the level
    s = json.loads(out.read_text())["levels"][0]["summary"]
    assert s["num_ok"] == 4 and s["num_errors"] == 0

    async def never(request):
        return httpx.Response(503, json={"error": {"message": "loading"}})

    argv[argv.index("0.5")] = "0.1"
    assert main(argv, transport=httpx.MockTransport(never)) == 1
    data = json.loads(out.read_text())
    assert data["levels"] == [] and "loading" in data["error"]


@pytest.mark.anyio
async def test_failure_after_done_keeps_ok_and_mid_stream_failure_is_an_exception():
    def broken_after(events):
        async def body():
            for ev in events:
                yield sse(ev)
            raise httpx.RemoteProtocolError("peer closed connection")

        return httpx.Response(200, content=body())

    async def after_done(request):
        return broken_after(tokens_stream(3))

    async def mid_stream(request):
        return broken_after([text_chunk("a")])

    rec = await one(after_done)
    assert rec.status == OK and rec.output_tokens == 3
    rec = await one(mid_stream)
    assert rec.status == EXCEPTION and "RemoteProtocolError" in rec.error and rec.num_chunks == 1


# ------------------------------------------------------------------------------- --plot


PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _assert_nontrivial_png(path) -> None:
    mpimg = pytest.importorskip("matplotlib.image")
    assert path.exists() and path.read_bytes()[:8] == PNG_MAGIC
    assert path.stat().st_size > 20_000
    img = mpimg.imread(path)
    h, w = img.shape[:2]
    assert w > 600 and h > 400
    rgba = (np.asarray(img)[..., :4] * 255).astype(np.uint8)  # imread gives PNGs as 0..1 floats
    if rgba.shape[-1] == 3:
        rgba = np.concatenate([rgba, np.full(rgba.shape[:2] + (1,), 255, np.uint8)], axis=-1)
    colours = np.unique(np.ascontiguousarray(rgba).view(np.uint32))  # one uint32 per pixel
    assert len(colours) > 50  # lines, bars, text antialiasing: far more than a blank canvas


@pytest.fixture
def fake_server_url():
    """loadtest.fake_server on an ephemeral port, its event loop in a thread (the load test's
    own ``anyio.run`` stays in the main thread, as on the command line)."""
    from anyio.abc import SocketAttribute
    from anyio.from_thread import start_blocking_portal

    from loadtest.fake_server import FakeServer

    with start_blocking_portal() as portal:
        listener = portal.call(lambda: anyio.create_tcp_listener(local_host="127.0.0.1",
                                                                 local_port=0))
        port = listener.extra(SocketAttribute.local_port)
        served = portal.start_task_soon(listener.serve, FakeServer(0.001, 0.001, 1 << 30).handle)
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            served.cancel()
            portal.call(listener.aclose)


def test_plot_png_from_a_fake_server_run(tmp_path, capsys, fake_server_url):
    pytest.importorskip("matplotlib")
    from loadtest import plot

    png, out = tmp_path / "out.png", tmp_path / "res.json"
    argv = ["--url", fake_server_url, "--model", "fake", "--concurrency", "1,4",
            "--num-requests", "12", "--prompt-len", "4", "--output-len", "3:8",
            "--slo-ttft", "10000", "--out", str(out), "--plot", str(png), "-q"]
    assert main(argv) == 0
    stdout = capsys.readouterr().out.strip().splitlines()
    assert stdout[-1].startswith("c4")  # the table is still last
    _assert_nontrivial_png(png)

    data = json.loads(out.read_text())
    levels = plot.levels_from_json(data)
    assert [lv.label for lv in levels] == ["concurrency 1", "concurrency 4"]
    for lv, raw in zip(levels, data["levels"]):
        s = raw["summary"]
        assert s["num_ok"] == 12 == lv.num_ok
        assert len(lv.ttft_ms) == s["ttft"]["count"] and len(lv.itl_ms) == s["itl"]["count"] > 0
        assert lv.output_throughput == s["output_throughput"] and lv.goodput == s["goodput"]

    # the same picture later from the JSON
    again = tmp_path / "again.png"
    assert plot.main([str(out), str(again), "--note", "from the JSON"]) == 0
    _assert_nontrivial_png(again)


def test_plot_edge_levels_rates_interrupted_and_empty(tmp_path):
    pytest.importorskip("matplotlib")
    from loadtest.plot import LevelData, plot_levels

    rng = np.random.default_rng(0)
    levels = [
        LevelData("rate=2", "poisson", request_rate=2.0, ttft_ms=list(rng.uniform(20, 40, 30)),
                  itl_ms=list(rng.uniform(5, 9, 300)), output_throughput=120.0,
                  request_throughput=2.0, num_ok=30),
        LevelData("rate=8", "poisson", concurrency=4, request_rate=8.0, ttft_ms=[],
                  itl_ms=[], output_throughput=0.0, request_throughput=0.0, num_failed=5,
                  interrupted=True),
        LevelData("c16", "closed", concurrency=16, ttft_ms=[50.0], itl_ms=[],
                  output_throughput=10.0, num_ok=1),
    ]
    assert [lv.tick for lv in levels] == ["2", "8*", "16"]
    assert levels[1].label == "8 req/s (cap 4) (interrupted)"
    png = plot_levels(levels, tmp_path / "edge.png", model="m", endpoint="chat")
    _assert_nontrivial_png(png)


def test_plot_without_matplotlib_names_the_extra(tmp_path, capsys, monkeypatch):
    from loadtest.plot import PlotUnavailable, plot_results

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    with pytest.raises(PlotUnavailable, match=r"pip install 'aioinfer\[plot\]'"):
        plot_results([], tmp_path / "x.png", model="m", endpoint="completions")

    server = MockServer()
    out, png = tmp_path / "res.json", tmp_path / "x.png"
    argv = ["--model", "m", "--concurrency", "1", "--num-requests", "2", "--output-len", "2",
            "--out", str(out), "--plot", str(png), "-q"]
    with pytest.raises(SystemExit) as exc:
        main(argv, transport=httpx.MockTransport(server))
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--plot" in err and "aioinfer[plot]" in err and "Traceback" not in err
    assert server.calls == 0 and not out.exists() and not png.exists()  # failed before the run
