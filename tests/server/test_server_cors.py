"""vLLM's serve flags for browsers, proxies and TLS: CORS (--allowed-origins, --allow-credentials,
--allowed-methods, --allowed-headers, with Starlette's CORSMiddleware semantics), --root-path
(vLLM's test_root_path calls, both with the prefix and without it) and --ssl-*.

The CORS rules are checked on in-process apps (no model is loaded: preflights and the probes need
none); one real ``aioinfer serve`` over HTTPS, behind a root path, with an API key and CORS, runs
vLLM's root-path test through the openai client and a browser's preflight through the socket.
"""

from __future__ import annotations

import asyncio
import ssl
import time

import httpx
import openai
import pytest

from aioinfer.entrypoints.openai.api_server import create_app
from aioinfer.entrypoints.serve_cli import _check_tls, config_from_args
from aioinfer.server_config import ServerConfig
from server_process import ServerProcess
from serve_runs import parse, self_signed
from tiny_models import make_tiny_model_dir

PAGE = "https://app.example"
PREFLIGHT = {"Origin": PAGE, "Access-Control-Request-Method": "POST",
             "Access-Control-Request-Headers": "authorization, content-type"}


def call(config: ServerConfig, method: str, path: str, headers: dict[str, str] | None = None):
    """(status, headers, body) of one request to an app built from ``config`` (no engine loaded)."""
    async def go():
        client = create_app(config).test_client()
        response = await client.open(path, method=method, headers=headers or {})
        return response.status_code, response.headers, (await response.get_data()).decode()

    return asyncio.run(go())


# ---------------------------------------------------------------------------- CORS (in process)

def test_defaults_are_vllms_any_origin_any_method_any_header():
    status, headers, body = call(ServerConfig(), "OPTIONS", "/v1/chat/completions", PREFLIGHT)
    assert (status, body) == (200, "OK")
    assert headers["Access-Control-Allow-Origin"] == "*"
    assert set(headers["Access-Control-Allow-Methods"].split(", ")) >= {"GET", "POST", "OPTIONS", "DELETE"}
    assert headers["Access-Control-Allow-Headers"] == "authorization, content-type"  # what was asked, mirrored
    assert "Access-Control-Allow-Credentials" not in headers
    assert headers["Access-Control-Max-Age"] == "600"
    assert "Origin" in headers["Vary"]

    status, headers, _ = call(ServerConfig(), "GET", "/version", {"Origin": PAGE})
    assert status == 200 and headers["Access-Control-Allow-Origin"] == "*" and "Origin" in headers["Vary"]
    status, headers, _ = call(ServerConfig(), "GET", "/version")  # no Origin: no CORS answer, still Vary
    assert status == 200 and "Access-Control-Allow-Origin" not in headers and headers["Vary"] == "Origin"


def test_preflight_needs_no_api_key_and_errors_stay_readable():
    config = ServerConfig(api_key="secret")
    status, headers, _ = call(config, "OPTIONS", "/v1/chat/completions", PREFLIGHT)
    assert status == 200 and headers["Access-Control-Allow-Origin"] == "*"
    # The request itself still needs the key, and the page can read the 401 (it carries CORS headers).
    status, headers, body = call(config, "POST", "/v1/chat/completions", {"Origin": PAGE})
    assert status == 401 and "invalid_api_key" in body and headers["Access-Control-Allow-Origin"] == "*"
    # An OPTIONS that is no preflight (no Access-Control-Request-Method) is an ordinary request.
    assert call(config, "OPTIONS", "/v1/models", {"Origin": PAGE})[0] == 401


def test_listed_origins_are_echoed_others_get_nothing():
    config = ServerConfig(allowed_origins=[PAGE, "http://localhost:3000"])
    status, headers, _ = call(config, "OPTIONS", "/v1/completions", PREFLIGHT)
    assert status == 200 and headers["Access-Control-Allow-Origin"] == PAGE
    status, headers, _ = call(config, "GET", "/v1/models", {"Origin": "http://localhost:3000"})
    assert status == 200 and headers["Access-Control-Allow-Origin"] == "http://localhost:3000"
    assert headers["Vary"] == "Origin"

    status, headers, body = call(config, "OPTIONS", "/v1/completions", {**PREFLIGHT, "Origin": "https://evil.example"})
    assert (status, body) == (400, "Disallowed CORS origin") and "Access-Control-Allow-Origin" not in headers
    status, headers, _ = call(config, "GET", "/v1/models", {"Origin": "https://evil.example"})
    assert status == 200 and "Access-Control-Allow-Origin" not in headers  # the browser hides it from the page


def test_credentials_echo_the_origin_even_when_any_is_allowed():
    config = ServerConfig(allow_credentials=True)
    status, headers, _ = call(config, "OPTIONS", "/v1/completions", PREFLIGHT)
    assert status == 200 and headers["Access-Control-Allow-Origin"] == PAGE
    assert headers["Access-Control-Allow-Credentials"] == "true"
    _, headers, _ = call(config, "GET", "/version", {"Origin": PAGE})
    assert headers["Access-Control-Allow-Origin"] == PAGE and headers["Access-Control-Allow-Credentials"] == "true"
    assert headers["Vary"] == "Origin"


def test_methods_and_headers_outside_the_lists_fail_the_preflight():
    config = ServerConfig(allowed_methods=["get", "POST"], allowed_headers=["Authorization"])
    status, headers, _ = call(config, "OPTIONS", "/v1/completions", PREFLIGHT)
    assert status == 200 and headers["Access-Control-Allow-Methods"] == "GET, POST"
    # the safelisted headers are always allowed, the listed ones besides
    assert headers["Access-Control-Allow-Headers"] == "Accept, Accept-Language, Content-Language, Content-Type, " \
                                                      "Authorization"
    denied = call(config, "OPTIONS", "/v1/completions", {**PREFLIGHT, "Access-Control-Request-Method": "DELETE",
                                                         "Access-Control-Request-Headers": "x-custom"})
    assert denied[0] == 400 and denied[2] == "Disallowed CORS method, headers"


def test_private_network_preflights_are_refused_as_starlette_does():
    status, _, body = call(ServerConfig(), "OPTIONS", "/v1/completions",
                           {**PREFLIGHT, "Access-Control-Request-Private-Network": "true"})
    assert (status, body) == (400, "Disallowed CORS private-network")


def test_no_origins_turns_cors_off():
    config = ServerConfig(allowed_origins=[])
    status, headers, _ = call(config, "OPTIONS", "/v1/models", PREFLIGHT)
    assert status == 200 and set(headers["Allow"].split(", ")) == {"GET", "HEAD", "OPTIONS"}  # Quart's own answer
    assert "Access-Control-Allow-Origin" not in headers  # which the browser takes as a refusal
    _, headers, _ = call(config, "GET", "/version", {"Origin": PAGE})
    assert "Access-Control-Allow-Origin" not in headers and "Vary" not in headers


def test_cors_settings_from_flags_and_variables(capsys):
    config = config_from_args(parse(["m", "--allowed-origins", '["https://a.example"]', "--allow-credentials",
                                     "--allowed-methods", '["GET"]', "--allowed-headers", "[]"]), {})
    assert config.allowed_origins == ("https://a.example",) and config.allow_credentials is True
    assert config.allowed_methods == ("GET",) and config.allowed_headers == ()
    env = {"AIOINFER_ALLOWED_ORIGINS": '["https://b.example", "*"]', "AIOINFER_ALLOW_CREDENTIALS": "true",
           "AIOINFER_ROOT_PATH": "/llm"}
    config = ServerConfig.from_env(env)
    assert config.allowed_origins == ("https://b.example", "*") and config.allow_credentials
    assert config.root_path == "/llm"
    assert config_from_args(parse(["m", "--no-allow-credentials"]), env).allow_credentials is False
    with pytest.raises(ValueError, match="AIOINFER_ALLOWED_ORIGINS: expected a JSON list of strings"):
        ServerConfig.from_env({"AIOINFER_ALLOWED_ORIGINS": "https://a.example"})
    with pytest.raises(SystemExit) as exit_info:
        parse(["m", "--allowed-origins", "*"])
    assert exit_info.value.code == 2 and "--allowed-origins" in capsys.readouterr().err
    with pytest.raises(ValueError, match="allowed_methods must be a list of strings"):
        ServerConfig(allowed_methods="GET")


# ---------------------------------------------------------------------------- root path (in process)

@pytest.mark.parametrize("root_path", ["/llm", "/llm/"])
def test_root_path_serves_with_and_without_the_prefix(root_path):
    config = ServerConfig(root_path=root_path)
    assert call(config, "GET", "/llm/version")[0] == 200
    assert call(config, "GET", "/version")[0] == 200
    assert call(config, "GET", "/llmx/version")[0] == 404
    assert call(ServerConfig(), "GET", "/llm/version")[0] == 404  # no root path: the prefix is a path like any
    with pytest.raises(ValueError, match="root_path must start with '/'"):
        ServerConfig(root_path="llm")


def test_root_path_given_by_the_server_also_serves_both():
    """``hypercorn --root-path /llm aioinfer.app:app``: the prefix arrives in the ASGI scope."""
    async def status(path: str) -> int:
        client = create_app(ServerConfig()).test_client()
        return (await client.get(path, root_path="/llm")).status_code

    assert asyncio.run(status("/llm/version")) == 200
    assert asyncio.run(status("/version")) == 200


# ---------------------------------------------------------------------------- TLS settings

def test_tls_settings_are_checked_before_anything_loads(tmp_path):
    cert_file, key_file = self_signed(tmp_path)
    (tmp_path / "other").mkdir()
    other_cert, _ = self_signed(tmp_path / "other")
    _check_tls(ServerConfig(ssl_certfile=str(cert_file), ssl_keyfile=str(key_file)))  # a matching pair
    combined = tmp_path / "combined.pem"  # the key inside the certificate file, as uvicorn (vLLM) reads it
    combined.write_bytes(cert_file.read_bytes() + key_file.read_bytes())
    _check_tls(ServerConfig(ssl_certfile=str(combined)))
    with pytest.raises(ValueError, match="TLS: cannot use"):
        _check_tls(ServerConfig(ssl_certfile=str(other_cert), ssl_keyfile=str(key_file)))  # another key
    with pytest.raises(ValueError, match="ssl_keyfile: no such file"):
        ServerConfig(ssl_certfile=str(cert_file), ssl_keyfile=str(tmp_path / "missing.pem"))
    with pytest.raises(ValueError, match="ssl_keyfile without ssl_certfile"):
        ServerConfig(ssl_keyfile=str(key_file))
    with pytest.raises(ValueError, match="ssl_cert_reqs without ssl_certfile"):
        ServerConfig(ssl_cert_reqs=2)
    with pytest.raises(ValueError, match=r"ssl_cert_reqs must be an integer in \[0, 2\]"):
        ServerConfig(ssl_certfile=str(cert_file), ssl_cert_reqs=3)
    config = config_from_args(parse(["m", "--ssl-certfile", str(cert_file), "--ssl-keyfile", str(key_file),
                                     "--ssl-ca-certs", str(cert_file), "--ssl-cert-reqs", "1"]), {})
    assert (config.ssl_certfile, config.ssl_keyfile, config.ssl_ca_certs, config.ssl_cert_reqs) == \
        (str(cert_file), str(key_file), str(cert_file), 1)


# ---------------------------------------------------------------------------- one real server

API_KEY = "abc-123"
ROOT_PATH = "llm"


@pytest.fixture(scope="module")
def https_server(tmp_path_factory):
    """``aioinfer serve`` over HTTPS under --root-path /llm, with an API key and one allowed origin."""
    folder = tmp_path_factory.mktemp("tls")
    cert_file, key_file = self_signed(folder)
    model_dir = make_tiny_model_dir(tmp_path_factory.mktemp("qwen2"), arch="qwen2")
    argv = ["{python}", "-m", "aioinfer", "serve", str(model_dir), "--port", "{port}", "--dtype", "float32",
            "--device", "cpu", "--max-model-len", "256", "--num-kv-blocks", "64",
            "--root-path", "/" + ROOT_PATH, "--ssl-certfile", str(cert_file), "--ssl-keyfile", str(key_file),
            "--allowed-origins", f'["{PAGE}"]', "--disable-log-requests"]
    server = ServerProcess({"AIOINFER_API_KEY": API_KEY}, argv=argv)
    context = ssl.create_default_context(cafile=str(cert_file))
    url = f"https://127.0.0.1:{server.port}"
    try:
        _wait_ready(server, url, context)
        yield server, url, context
    finally:
        code = server.stop()
        server.close_log()
    assert code == 0


def _wait_ready(server: ServerProcess, url: str, context: ssl.SSLContext, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(f"server exited with {server.proc.returncode}:\n{server.output()}")
        try:
            if httpx.get(url + "/ready", verify=context, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"server not ready after {timeout} s:\n{server.output()}")


@pytest.mark.parametrize("base_url, api_key, expected_error", [
    (["v1"], "abc", openai.AuthenticationError),
    ([ROOT_PATH, "v1"], "abc", openai.AuthenticationError),
    (["v1"], API_KEY, None),
    ([ROOT_PATH, "v1"], API_KEY, None),
], ids=["no-prefix-bad-key", "prefix-bad-key", "no-prefix", "prefix"])
def test_vllm_root_path_calls_over_https(https_server, base_url, api_key, expected_error):
    """vLLM's tests/entrypoints/openai test_root_path: the same four clients, through TLS here."""
    server, url, context = https_server
    with httpx.Client(verify=context) as http_client:
        client = openai.OpenAI(api_key=api_key, base_url="/".join([url, *base_url]), max_retries=0,
                               http_client=http_client)
        saying = "Here is a common saying about apple. An apple a day, keeps"
        messages = [{"role": "user", "content": "tell me a common saying"}, {"role": "assistant", "content": saying}]
        if expected_error is not None:
            with pytest.raises(expected_error):
                client.chat.completions.create(model="any", messages=messages, max_tokens=4)
            return
        model = client.models.list().data[0].id
        chat = client.chat.completions.create(model=model, messages=messages, max_tokens=4,
                                              extra_body={"continue_final_message": True,
                                                          "add_generation_prompt": False})
    assert chat.id is not None and len(chat.choices) == 1
    choice = chat.choices[0]
    assert choice.message.role == "assistant" and choice.message.content  # a random model: text, not the saying
    assert choice.finish_reason in ("stop", "length")


def test_browser_preflight_and_plain_http_on_the_real_server(https_server):
    server, url, context = https_server
    for path in ("/v1/chat/completions", f"/{ROOT_PATH}/v1/chat/completions"):
        preflight = httpx.options(url + path, headers=PREFLIGHT, verify=context)
        assert preflight.status_code == 200, preflight.text  # no API key on a preflight
        assert preflight.headers["access-control-allow-origin"] == PAGE
    refused = httpx.get(url + "/v1/models", headers={"Origin": "https://evil.example",
                                                     "Authorization": f"Bearer {API_KEY}"}, verify=context)
    assert refused.status_code == 200 and "access-control-allow-origin" not in refused.headers
    with pytest.raises(httpx.HTTPError):  # TLS only: plain HTTP on the port gets no answer
        httpx.get(f"http://127.0.0.1:{server.port}/health", timeout=5)
    with pytest.raises(httpx.ConnectError):  # and a client that does not trust the certificate refuses it
        httpx.get(url + "/health", timeout=5)
