"""HTTP edges of the server as a real ``hypercorn aioinfer.app:app`` process, through real clients.

- Oversized bodies: every client gets the 413 (asyncio clients used to get a connection reset,
  and AsyncOpenAI's retries resent the whole body), with ``Connection: close``.
- Answers given before a route reads its body (404, 415) reach asyncio clients too.
- JSON routes require ``Content-Type: application/json`` (415 otherwise, as vLLM).
- Chat content as a list of text parts works through the openai client; other parts are a clear 400.
"""

from __future__ import annotations

import asyncio

import httpx
import openai
import orjson
import pytest
from openai import AsyncOpenAI, OpenAI

from server_process import metric, metric_samples, start_server
from tiny_models import make_tiny_model_dir

LIMIT = 8 * 1024 * 1024  # the default AIOINFER_MAX_BODY_BYTES, set explicitly
OVERSIZED_PROMPT = "a" * 9_437_184  # the 9 MB body: within BodyLimit's drain bound (4 x LIMIT)
JSON = {"Content-Type": "application/json"}
ERROR_KEYS = {"message", "type", "param", "code"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model_dir = str(make_tiny_model_dir(tmp_path_factory.mktemp("qwen2"), arch="qwen2"))
    proc = start_server({"AIOINFER_MODEL": model_dir, "AIOINFER_DEVICE": "cpu", "AIOINFER_DTYPE": "float32",
                         "AIOINFER_MAX_MODEL_LEN": "256", "AIOINFER_NUM_KV_BLOCKS": "128",
                         "AIOINFER_MAX_BODY_BYTES": str(LIMIT), "AIOINFER_CPU_THREADS": "1"})
    yield proc
    assert proc.stop() == 0, proc.output()
    proc.close_log()


@pytest.fixture(scope="module")
def model_name(server):
    return OpenAI(base_url=server.base_url, api_key="unused", max_retries=0).models.list().data[0].id


def oversized_body() -> bytes:
    return b'{"prompt": "' + OVERSIZED_PROMPT.encode() + b'"}'


def assert_too_large(response: httpx.Response) -> None:
    assert response.status_code == 413, response.text
    error = response.json()["error"]
    assert set(error) == ERROR_KEYS and error["code"] == "request_too_large" and str(LIMIT) in error["message"]
    assert response.headers["connection"] == "close"


def count_413(server) -> float:
    return metric(metric_samples(server), "aioinfer:http_requests_total", status="413")


# ---------------------------------------------------------------------------- (A) oversized bodies

def test_async_httpx_gets_the_413(server):
    async def main():
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            for _ in range(3):  # each on a new connection: the server closes after a 413
                assert_too_large(await client.post("/v1/completions", content=oversized_body(), headers=JSON))
            ok = await client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
            assert ok.status_code == 200, ok.text

    asyncio.run(main())


def test_async_httpx_gets_the_413_for_a_chunked_body(server):
    async def chunks(padding: int):
        # Valid JSON whatever the size: the padding is whitespace, the prompt stays short.
        yield b'{"prompt": "hi", "max_tokens": 2'
        for _ in range(padding // 65536):
            yield b" " * 65536
        yield b"}"

    async def main():
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            # No Content-Length: the limit is found while reading, and the rest is still read.
            assert_too_large(await client.post("/v1/completions", content=chunks(LIMIT + 4 * 65536), headers=JSON))
            # Within the limit, the chunks reach the route whole.
            ok = await client.post("/v1/completions", content=chunks(LIMIT - 4 * 65536), headers=JSON)
            assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2, ok.text

    asyncio.run(main())


def test_sync_httpx_gets_the_413(server):
    assert_too_large(httpx.post(server.url + "/v1/completions", content=oversized_body(), headers=JSON, timeout=60))


def test_async_openai_gets_the_413_and_does_not_resend(server, model_name):
    async def call(**retries):
        async with AsyncOpenAI(base_url=server.base_url, api_key="unused", timeout=60, **retries) as client:
            with pytest.raises(openai.APIStatusError) as info:
                await client.completions.create(model=model_name, prompt=OVERSIZED_PROMPT, max_tokens=1)
        assert info.value.status_code == 413 and info.value.code == "request_too_large"
        assert info.value.response.headers["connection"] == "close"

    for retries in ({"max_retries": 0}, {}):  # {}: the client's default retries, which must not resend the body
        before = count_413(server)
        asyncio.run(call(**retries))
        assert count_413(server) == before + 1  # one request reached the server, not 1 + retries


def test_answers_before_the_body_is_read_reach_async_clients(server):
    body = b'{"prompt": "' + b"a" * (4 * 1024 * 1024) + b'"}'  # within the limit, far beyond socket buffers

    async def main():
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            missing = await client.post("/v2/nothing", content=body, headers=JSON)
            assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
            plain = await client.post("/v1/completions", content=body, headers={"Content-Type": "text/plain"})
            assert plain.status_code == 415 and plain.json()["error"]["code"] == "unsupported_media_type"

    asyncio.run(main())


# ---------------------------------------------------------------------------- (B) Content-Type

JSON_ROUTES = {
    "/v1/completions": {"prompt": "hi", "max_tokens": 2},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    "/tokenize": {"prompt": "hi"},
    "/detokenize": {"tokens": [5, 6]},
}


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data",
                                          "application/jsonx", None])
@pytest.mark.parametrize("path", sorted(JSON_ROUTES))
def test_json_routes_refuse_other_media_types(server, path, content_type):
    headers = {} if content_type is None else {"Content-Type": content_type}
    response = httpx.post(server.url + path, content=orjson.dumps(JSON_ROUTES[path]), headers=headers)
    assert response.status_code == 415, response.text
    error = response.json()["error"]
    assert set(error) == ERROR_KEYS and error["type"] == "invalid_request_error"
    assert error["code"] == "unsupported_media_type" and "application/json" in error["message"]


@pytest.mark.parametrize("content_type", ["application/json", "Application/JSON; charset=utf-8",
                                          "application/json ;charset=UTF-8"])
@pytest.mark.parametrize("path", sorted(JSON_ROUTES))
def test_json_routes_take_json_with_parameters(server, path, content_type):
    response = httpx.post(server.url + path, content=orjson.dumps(JSON_ROUTES[path]),
                          headers={"Content-Type": content_type})
    assert response.status_code == 200, response.text


# ---------------------------------------------------------------------------- (D) list content

def test_openai_client_list_content_equals_string_content(server, model_name):
    client = OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
    as_parts = [{"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
                {"role": "user", "content": [{"type": "text", "text": "Hello"}, {"type": "text", "text": "world"}]}]
    as_string = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello\nworld"}]
    args = dict(model=model_name, max_tokens=8, temperature=0)
    got = client.chat.completions.create(messages=as_parts, **args)
    want = client.chat.completions.create(messages=as_string, **args)
    assert got.choices[0].message.content == want.choices[0].message.content
    assert got.usage.prompt_tokens == want.usage.prompt_tokens
    tokenized = [httpx.post(server.url + "/tokenize", json={"messages": m}).json()["tokens"]
                 for m in (as_parts, as_string)]
    assert tokenized[0] == tokenized[1]


@pytest.mark.parametrize("part", [{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
                                  {"type": "input_audio", "input_audio": {"data": "", "format": "wav"}},
                                  {"type": "file", "file": {"file_id": "f"}}])
def test_openai_client_non_text_part_is_a_clear_400(server, model_name, part):
    client = OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": [{"type": "text", "text": "What is this?"}, part]}]
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=model_name, messages=messages, max_tokens=2)
    error = info.value.body
    assert error["param"] == "messages.0.content.1", error
    assert repr(part["type"]) in error["message"] and "text only" in error["message"], error
