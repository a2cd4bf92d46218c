"""Issue 54, items 2, 3, 6 and 7, through a real ``hypercorn aioinfer.app:app``: what a constraint may
cost is bounded, and the server and its engine survive every constraint a client sends.

- 2: constraints deep enough to overflow the compiler's stack (SIGSEGV) are 400s naming the bound;
  a fatal signal in the worker ends hypercorn with a failing status and a log line.
- 3: a grammar limit met mid-output ends the choice with ``finish_reason: "error"``, never "stop".
- 6: a constraint that matches nothing is a 400.
- 7: a constraint over the size bound, or one that does not compile within the budget, is a 400
  naming the setting; the same constraint again costs no second compile.

After each: /health 200 and an ordinary constrained request still answered.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time

import httpx
import pytest

from deep_schemas import UNSATISFIABLE, anyof_chain, items_chain, ref_chain, rule_chain

MODEL = "SmolLM2-135M-Instruct"
PERSON = {"type": "object", "additionalProperties": False, "required": ["name"],
          "properties": {"name": {"type": "string", "maxLength": 12}}}
ENV = {"AIOINFER_DEVICE": "cpu", "AIOINFER_DTYPE": "float32", "AIOINFER_MAX_MODEL_LEN": "2048",
       "AIOINFER_CPU_KV_CACHE_GIB": "0.25"}


@pytest.fixture(scope="module")
def server(smollm2_gguf):
    """Default limits; async scheduling on, as on CUDA: the masks are filled by the worker thread, the
    path where a failed matcher must be noticed before that thread takes it."""
    from server_process import start_server

    proc = start_server({**ENV, "AIOINFER_ASYNC_SCHEDULING": "true"})
    yield proc
    assert proc.stop() == 0, proc.output()
    proc.close_log()


@pytest.fixture(scope="module")
def tight_server(smollm2_gguf):
    """A compile budget of 0.5 s, lockstep steps; its last test ends it with a fatal signal."""
    from server_process import start_server

    proc = start_server({**ENV, "AIOINFER_STRUCTURED_OUTPUTS_COMPILE_TIMEOUT": "0.5"})
    yield proc
    proc.stop()
    proc.close_log()


def _chat(server, extra: dict, stream: bool = False, max_tokens: int = 12) -> httpx.Response:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Give me JSON."}], "max_tokens": max_tokens,
            "temperature": 0, "stream": stream, **extra}
    return httpx.post(server.base_url + "/chat/completions", json=body, timeout=120)


def _schema(schema: dict) -> dict:
    return {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}


def _still_serving(server) -> None:
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200
    response = _chat(server, _schema(PERSON), max_tokens=30)
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    assert choice["finish_reason"] in ("stop", "length")
    if choice["finish_reason"] == "stop":
        assert set(json.loads(choice["message"]["content"])) == {"name"}


def _refused(response: httpx.Response, code: str, *words: str) -> None:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == code and all(word in error["message"] for word in words), error


DEEP = {  # ~930 $refs, ~1,100 anyOf/items hops, ~2,700 rules: each killed the process (SIGSEGV)
    "$ref chain": _schema(ref_chain(1000)),
    "anyOf chain": _schema(anyof_chain(1100)),
    "items chain": _schema(items_chain(1100)),
    "Lark rules": {"structured_outputs": {"grammar": rule_chain(2700)}},
    "GBNF rules": {"guided_grammar": rule_chain(2700, gbnf=True)},
}


def test_constraints_deep_enough_to_crash_the_compiler_are_400s(server):
    for name, extra in DEEP.items():
        response = _chat(server, extra)
        _refused(response, "constraint_limit_exceeded", "more than the limit of" if "rules" in name else "deeper than")
    _still_serving(server)


def test_constraints_that_match_nothing_are_400s(server):
    for name, fields in UNSATISFIABLE.items():
        extra = _schema(fields["json"]) if "json" in fields else {"structured_outputs": fields}
        _refused(_chat(server, extra), "invalid_value", "matches no output")
    _still_serving(server)


MID_OUTPUT = {  # each compiles, then fails at the first or second token
    "lexer limit (pattern)": _schema({"type": "string", "pattern": "^(a{1000}){1000}$"}),
    "Earley row limit (2,500 alternatives)": {
        "structured_outputs": {"grammar": "start: x\nx: " + " | ".join(f'"w{i:04d}"' for i in range(2500))}},
    "dead end": {"guided_grammar": 'start: "a" x\nx: x'},
}


@pytest.mark.parametrize("name", list(MID_OUTPUT))
def test_a_limit_met_mid_output_ends_with_error_never_stop(server, name):
    extra = MID_OUTPUT[name]
    response = _chat(server, extra)
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    assert choice["finish_reason"] == "error", choice
    assert "could not be kept to its constraint" in choice["stop_reason"]
    with httpx.stream("POST", server.base_url + "/chat/completions", timeout=120,
                      json={"model": MODEL, "messages": [{"role": "user", "content": "Give me JSON."}],
                            "max_tokens": 12, "temperature": 0, "stream": True, **extra}) as streamed:
        chunks = [json.loads(line[6:]) for line in streamed.iter_lines() if line.startswith("data: {")]
    reasons = [c["finish_reason"] for chunk in chunks for c in chunk["choices"] if c["finish_reason"]]
    assert reasons == ["error"], reasons
    completion = httpx.post(server.base_url + "/completions", timeout=120,
                            json={"model": MODEL, "prompt": "JSON:", "max_tokens": 12, "temperature": 0, **extra})
    assert completion.status_code == 200 and completion.json()["choices"][0]["finish_reason"] == "error"
    _still_serving(server)


def test_a_response_whose_output_broke_its_constraint_is_failed_never_completed(server):
    # The Responses API's form of finish_reason "error": status "failed" with the reason in ``error``.
    from openai import OpenAI

    client = OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
    text = {"format": {"type": "json_schema", "name": "x", "schema": {"type": "string", "pattern": "^(a{1000}){1000}$"}}}
    response = client.responses.create(model=MODEL, input="Give me JSON.", max_output_tokens=12, temperature=0,
                                       text=text)
    assert response.status == "failed" and response.error.code == "server_error", response
    assert "could not be kept to its constraint" in response.error.message
    events = list(client.responses.create(model=MODEL, input="Give me JSON.", max_output_tokens=12, temperature=0,
                                          text=text, stream=True))
    assert events[-1].type == "response.failed" and events[-1].response.status == "failed"
    _still_serving(server)


def test_a_constraint_over_the_size_bound_is_a_400_naming_the_setting(server):
    rng = random.Random(7)
    choices = ["".join(rng.choice("abcdefghij0123456789") for _ in range(9)) for _ in range(100_000)]  # 1.3 MB
    _refused(_chat(server, {"guided_choice": choices}), "constraint_limit_exceeded",
             "more than the limit of 1048576", "AIOINFER_STRUCTURED_OUTPUTS_MAX_BYTES")
    _still_serving(server)


def test_a_compile_over_the_budget_is_a_400_and_is_not_paid_twice(tight_server):
    """60,000 alternatives of a Lark rule take seconds to build (llguidance's Earley grammar), 0.5 s
    is the budget: a 400 naming the setting; sent again, a 400 from the cache, without a compile."""
    rng = random.Random(3)
    grammar = "start: x\nx: " + " | ".join(json.dumps("".join(rng.choice("abcdefghijklmnop") for _ in range(8)))
                                              for _ in range(60_000))
    for _ in range(2):
        _refused(_chat(tight_server, {"structured_outputs": {"grammar": grammar}}), "constraint_limit_exceeded",
                 "did not compile within 0.5 s", "AIOINFER_STRUCTURED_OUTPUTS_COMPILE_TIMEOUT")
    _still_serving(tight_server)
    # Lockstep steps (the matchers advanced on the engine thread) end a failed grammar the same way.
    choice = _chat(tight_server, MID_OUTPUT["dead end"]).json()["choices"][0]
    assert choice["finish_reason"] == "error" and choice["message"]["content"] == "a"


def test_a_fatal_signal_in_the_worker_ends_hypercorn_with_a_failure(tight_server):
    """hypercorn 0.18's main process exits 0 when its worker dies (app.py says why): the watcher ends
    it with SIGKILL instead, and faulthandler's report of the worker's threads is in the log."""
    worker = _hypercorn_worker(tight_server.proc.pid)
    os.kill(worker, signal.SIGSEGV)
    status = tight_server.proc.wait(timeout=60)
    output = tight_server.output()
    assert status != 0, output[-3000:]
    assert "Fatal Python error: Segmentation fault" in output
    assert f"the server worker (pid {worker}) died of a fatal signal" in output


def _hypercorn_worker(pid: int) -> int:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            for child in f.read().split():
                with open(f"/proc/{child}/cmdline", "rb") as cmdline:
                    if b"spawn_main" in cmdline.read():
                        return int(child)
        time.sleep(0.1)
    raise AssertionError("no hypercorn worker process found")
