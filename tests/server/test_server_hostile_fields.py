"""Hostile request fields against a real ``hypercorn aioinfer.app:app`` process (issue 54, items 4, 5, 8, 9).

A client chooses the names of the fields it sends and the JSON in them. None of it may fail a request
the server answers (a 500 after the tokens were generated, or the engine's death), reach a response
header or the operator's log raw (a CR/LF there forges a header or a JSON log line), or make a
response, and the host memory behind it, unbounded.

One server on the default model (SmolLM2, vocabulary 49152) whose ``max_logprobs`` (100000) is above
the vocabulary and whose ``max_logprob_entries`` is small enough to reach with a few positions of
whole-vocabulary logprobs. After every test the process and its engine are alive and /health is 200.
"""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server_process import start_server

VOCAB = 49152  # SmolLM2-135M's
BUDGET = 150_000  # AIOINFER_MAX_LOGPROB_ENTRIES here: 3 positions of the whole vocabulary fit, 4 do not
HEADER = "X-Aioinfer-Ignored-Fields"
FORGED = '{"ts":1,"event":"request","request_id":"forged","status":"finished"}'
# Every route that answers with a body built from the request, and a minimal body for each.
ROUTES = {
    "/v1/completions": {"prompt": "The sky is", "max_tokens": 2, "temperature": 0},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "temperature": 0},
    "/v1/responses": {"input": "Hi", "max_output_tokens": 2, "temperature": 0},
}


@pytest.fixture(scope="module")
def server(smollm2_gguf):
    proc = start_server({"AIOINFER_DEVICE": "cpu", "AIOINFER_DTYPE": "float32", "AIOINFER_MAX_MODEL_LEN": "512",
                         "AIOINFER_MAX_LOGPROBS": "100000", "AIOINFER_MAX_LOGPROB_ENTRIES": str(BUDGET)})
    yield proc
    assert proc.stop() == 0, proc.output()
    proc.close_log()


@pytest.fixture(autouse=True)
def _alive_after(server):
    yield
    assert server.proc.poll() is None, server.output()
    health = httpx.get(server.url + "/health", timeout=10)
    assert health.status_code == 200 and health.json() == {"status": "ok"}, health.text


def post(server, route: str, body: dict, **kwargs) -> httpx.Response:
    return httpx.post(server.url + route, content=json.dumps(body), timeout=120,
                      headers={"Content-Type": "application/json"}, **kwargs)


def log_lines(server) -> list[str]:
    return server.output().splitlines()


def assert_printable(value: str) -> None:
    assert all("!" <= ch <= "~" or ch == " " for ch in value), repr(value)


# ------------------------------------------------------------------ item 4: CR/LF in an unknown field's name

@pytest.mark.parametrize("route", sorted(ROUTES))
@pytest.mark.parametrize("stream", [False, True])
def test_crlf_in_an_unknown_field_name_is_answered_and_escaped(server, route, stream):
    name = "x\r\nX-Injected: 1\n" + FORGED
    response = post(server, route, {**ROUTES[route], name: 1, "stream": stream})
    assert response.status_code == 200, response.text
    assert "X-Injected" not in response.headers
    shown = response.headers[HEADER]
    assert_printable(shown)
    assert shown.startswith("x\\x0d\\x0aX-Injected:\\x201\\x0a")
    if stream:  # the whole stream, without an error event
        text = response.text
        assert '"error":{' not in text and '"type":"error"' not in text
        assert text.rstrip().endswith("[DONE]") or "event: response.incomplete" in text, text[-300:]
    # The log has the escaped name on the warning line, and no line a client wrote.
    lines = log_lines(server)
    assert any("ignored request fields (1): x\\x0d\\x0aX-Injected" in line for line in lines)
    assert not any(line.startswith(("X-Injected", FORGED[:20])) for line in lines)


def test_a_message_field_name_and_odd_names_are_escaped(server):
    body = {"messages": [{"role": "user", "content": "Hi", "a\nb": 1}], "max_tokens": 1, " ": 1, "": 2,
            "é,\\": 3, "\x00": 4}
    response = post(server, "/v1/chat/completions", body)
    assert response.status_code == 200, response.text
    assert response.headers[HEADER] == '\\x20, "", \\xe9\\x2c\\x5c, \\x00, messages[0].a\\x0ab'


# ------------------------------------------------------------------ item 5: `messages` that are not chat messages

@pytest.mark.parametrize("messages", [5, [1], "ab", {"role": "user"}, [{"role": 1}], [[]], None])
@pytest.mark.parametrize("route", ["/v1/completions", "/v1/responses"])
def test_an_unknown_messages_field_of_any_type_is_ignored(server, route, messages):
    response = post(server, route, {**ROUTES[route], "messages": messages})
    assert response.status_code == 200, response.text
    assert response.headers[HEADER] == "messages"


# ------------------------------------------------------------------ item 9: bounded names in the header and log

def test_long_and_many_names_are_cut_and_counted(server):
    body = {**ROUTES["/v1/completions"], "y" * 100_000: 1, **{f"f{i}": i for i in range(100)}}
    response = post(server, "/v1/completions", body)
    assert response.status_code == 200, response.text
    shown = response.headers[HEADER]
    assert shown.startswith("y" * 64 + "..., f0, f1,") and shown.endswith("f14 (+85 more)")
    assert len(shown) < 300
    warning = [line for line in log_lines(server) if "ignored request fields (101)" in line]
    assert len(warning) == 1 and len(warning[0]) < 500 and "y" * 65 not in warning[0]


def test_request_log_lines_stay_json_and_bounded(server):
    """The request log's http_error line carries the client's X-Request-Id and path: escaped by the JSON
    encoder and cut, never a second line."""
    client_id = "z" * 5000
    response = httpx.post(server.url + "/v1/completions", content=b"{}", timeout=30,
                          headers={"Content-Type": "application/json", "X-Request-Id": client_id})
    assert response.status_code == 400
    lines = [line for line in log_lines(server) if '"event":"http_error"' in line and "zzzz" in line]
    assert lines and all(len(line) < 600 for line in lines)
    record = json.loads(lines[-1])
    assert record["request_id"] == "z" * 256 + "..."


# ------------------------------------------------------------------ item 8: logprobs bounded whatever the cap

def test_logprobs_above_the_vocabulary_are_a_400_not_an_engine_death(server):
    """max_logprobs (100000) is above the vocabulary: a count between the two is refused, not handed to the
    step's top-k (which failed on the engine's thread and ended the engine)."""
    for field in ("logprobs", "prompt_logprobs"):
        response = post(server, "/v1/completions", {**ROUTES["/v1/completions"], field: 60000})
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == field and "vocabulary" in error["message"]
    response = post(server, "/v1/chat/completions", {**ROUTES["/v1/chat/completions"], "logprobs": True,
                                                     "top_logprobs": 60000})
    assert response.status_code == 400 and response.json()["error"]["param"] == "top_logprobs"
    assert post(server, "/v1/completions", ROUTES["/v1/completions"]).status_code == 200


def test_whole_vocabulary_prompt_logprobs_are_bounded_by_the_entry_budget(server):
    fits = post(server, "/v1/completions", {"prompt": [1, 2, 3, 4], "max_tokens": 1, "prompt_logprobs": -1})
    assert fits.status_code == 200, fits.text
    entries = fits.json()["choices"][0]["prompt_logprobs"]
    assert entries[0] is None and [len(e) for e in entries[1:]] == [VOCAB] * 3
    # One more position, or the vocabulary asked for by count rather than -1: over the budget.
    for value in (-1, VOCAB):
        response = post(server, "/v1/completions", {"prompt": [1, 2, 3, 4, 5], "max_tokens": 1,
                                                    "prompt_logprobs": value})
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["code"] == "logprobs_limit_exceeded" and error["param"] == "prompt_logprobs"
        assert "AIOINFER_MAX_LOGPROB_ENTRIES" in error["message"] and str(BUDGET) in error["message"]


def test_generated_token_logprobs_count_max_tokens_and_choices(server):
    chat = {**ROUTES["/v1/chat/completions"], "logprobs": True, "top_logprobs": -1}
    fits = post(server, "/v1/chat/completions", {**chat, "max_tokens": 3, "ignore_eos": True})
    assert fits.status_code == 200, fits.text
    assert [len(t["top_logprobs"]) for t in fits.json()["choices"][0]["logprobs"]["content"]] == [VOCAB] * 3
    for body in ({**chat, "max_tokens": 4}, {k: v for k, v in chat.items() if k != "max_tokens"}):
        response = post(server, "/v1/chat/completions", body)
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == "top_logprobs"
    completion = {"prompt": "Hi", "max_tokens": 2, "logprobs": VOCAB - 1}
    assert post(server, "/v1/completions", completion).status_code == 200
    too_many = post(server, "/v1/completions", {**completion, "n": 2})
    assert too_many.status_code == 400 and "2 choices" in too_many.json()["error"]["message"]
    # echo + logprobs asks for the prompt's logprobs through logprobs: named so
    echoed = post(server, "/v1/completions", {**completion, "max_tokens": 1, "echo": True, "prompt": [1, 2, 3, 4, 5]})
    assert echoed.status_code == 400 and echoed.json()["error"]["param"] == "logprobs"


def test_a_stream_of_up_to_20_logprobs_a_token_is_not_refused_for_its_length(server):
    # Streamed chunk by chunk, such a stream's generated logprobs are never held together: only a
    # whole response (or more than 20 a position) counts them. 16 choices x 511 tokens x 21 > BUDGET.
    chat = {**ROUTES["/v1/chat/completions"], "logprobs": True, "top_logprobs": 20, "n": 16}
    chat.pop("max_tokens")
    whole = post(server, "/v1/chat/completions", chat)
    assert whole.status_code == 400 and whole.json()["error"]["code"] == "logprobs_limit_exceeded", whole.text
    with httpx.stream("POST", server.url + "/v1/chat/completions", json={**chat, "stream": True}, timeout=120) as stream:
        assert stream.status_code == 200
        first = next(line for line in stream.iter_lines() if line.startswith("data: "))
        assert '"choices"' in first  # then the client leaves: the engine aborts the choices
    too_wide = post(server, "/v1/chat/completions", {**chat, "top_logprobs": 21, "stream": True})
    assert too_wide.status_code == 400 and too_wide.json()["error"]["param"] == "top_logprobs", too_wide.text


# ------------------------------------------------------------------ beyond the listed items

def test_responses_echo_a_schema_with_a_huge_integer(server):
    """/v1/responses echoes the request's tools and text format; an integer beyond 64 bits is valid JSON
    there (orjson refuses it): the response is still written, the number kept."""
    huge = 10 ** 30
    schema = {"type": "object", "properties": {"a": {"type": "integer", "maximum": huge}}}
    tools = [{"type": "function", "name": "f", "parameters": schema}]
    for stream in (False, True):
        response = post(server, "/v1/responses", {**ROUTES["/v1/responses"], "tools": tools, "stream": stream})
        assert response.status_code == 200, response.text
        assert f'"maximum": {huge}' in response.text and '"type":"error"' not in response.text
    fmt = {"format": {"type": "json_schema", "name": "n", "schema": {"type": "integer", "maximum": huge}}}
    response = post(server, "/v1/responses", {**ROUTES["/v1/responses"], "text": fmt})
    assert response.status_code == 200, response.text
    assert response.json()["text"]["format"]["schema"]["maximum"] == huge


# JSON values of every kind, odd strings included; the field names a client may invent.
_TEXT = st.text(max_size=8) | st.sampled_from(["\r\n", "\x00", "-1", "messages", "functions", "x" * 200])
_VALUES = st.recursive(st.none() | st.booleans() | st.integers(-3, 3) | st.sampled_from([2 ** 64, -(2 ** 63) - 1])
                       | st.floats(allow_nan=False, allow_infinity=False) | _TEXT,
                       lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
                       max_leaves=5)
_KNOWN = ["temperature", "top_p", "top_k", "n", "seed", "stop", "stop_token_ids", "logit_bias", "min_tokens",
          "stream_options", "priority", "cache_salt", "prompt_logprobs", "response_format", "structured_outputs",
          "guided_json", "guided_choice", "logprobs", "top_logprobs", "echo", "tools", "tool_choice", "metadata",
          "chat_template_kwargs", "include", "text", "messages"]


@settings(max_examples=60, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(route=st.sampled_from(sorted(ROUTES)), known=st.dictionaries(st.sampled_from(_KNOWN), _VALUES, max_size=2),
       unknown=st.dictionaries(_TEXT, _VALUES, max_size=2))
def test_odd_values_and_names_never_500(server, route, known, unknown):
    """A small deterministic fuzz of the bodies: odd JSON in known fields and invented fields are a 200
    or a 4xx, never a 5xx; the ignored-fields header is printable ASCII."""
    body = {**unknown, **ROUTES[route], **known}
    response = post(server, route, body)
    assert response.status_code < 500, (body, response.text)
    if HEADER in response.headers:
        assert_printable(response.headers[HEADER])


@pytest.mark.parametrize("item", [
    {"role": ["user"], "content": "Hi"},
    {"role": {"a": 1}, "content": "Hi"},
    {"role": "user", "content": [{"type": ["input_text"], "text": "Hi"}]},
    {"role": "user", "content": [{"type": {"x": 1}, "text": "Hi"}]},
])
def test_responses_input_roles_and_part_types_of_any_type_are_a_400(server, item):
    response = post(server, "/v1/responses", {**ROUTES["/v1/responses"], "input": [item]})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"].startswith("input")


def test_made_up_http_methods_share_one_metrics_label(server):
    for method in ("AAA", "BBB", "ZZZ"):
        httpx.request(method, server.url + "/v1/models", timeout=10)
    metrics = httpx.get(server.url + "/metrics", timeout=10).text
    assert 'method="AAA"' not in metrics and 'method="BBB"' not in metrics
    assert 'method="other"' in metrics
