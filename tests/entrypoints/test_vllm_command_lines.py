"""A vLLM command line runs ``aioinfer serve`` unchanged, and what vLLM's clients and tests read in
its answers is there.

Parsed: each vLLM flag that used to stop ``serve`` (status 2) is taken with vLLM's meaning, or
refused with the reason where aioinfer would do something else. Run: one server started with all
of them at once (over HTTPS, its certificate renewed while it runs) answers; on it, usage on every
chunk under --enable-force-include-usage, /tokenize's chat fields, null ``prompt_logprobs`` /
``prompt_token_ids`` and the chosen token first in ``top_logprobs``.
"""

from __future__ import annotations

import json
import os
import ssl
import time
from pathlib import Path

import httpx
import pytest
from openai import AuthenticationError, OpenAI

from aioinfer.config import EngineConfig
from aioinfer.entrypoints.serve_cli import config_from_args
from aioinfer.entrypoints.serve_flags import VLLM_ENGINE_FLAGS
from aioinfer.vllm_options import CHECKED, translate
from server_process import ServerProcess
from serve_runs import assert_one_line_error, parse, run_serve, self_signed
from tiny_models import make_tiny_model_dir

DOCS = Path(__file__).resolve().parents[2] / "docs" / "vllm_compatibility.md"


def engine_kwargs(argv: list[str]) -> dict:
    return config_from_args(parse(["m", *argv]), {}).engine_kwargs


# ---------------------------------------------------------------------------- parsed

@pytest.mark.parametrize("text, value", [("2k", 2000), ("32K", 32768), ("25.6k", 25600), ("1m", 10**6),
                                         ("1M", 2**20), ("4096", 4096), (" 8K ", 8192)])
def test_sizes_take_vllms_suffixes(text, value):
    """vLLM's human_readable_int: lowercase powers of 1000 (decimals allowed), uppercase powers of 1024."""
    assert engine_kwargs(["--max-model-len", text, "--max-num-batched-tokens", text]) == {
        "max_model_len": value, "max_num_batched_tokens": value}


@pytest.mark.parametrize("argv, fragment", [
    (["--max-model-len", "1.5K"], "decimals only with k, m, g, t"),
    (["--max-model-len", "2kb"], "expected an integer such as 4096, 2k (2000) or 32K (32768), got '2kb'"),
    (["--max-model-len", "auto"], "the longest context that fits in memory) is not supported"),
    (["--max-num-batched-tokens", "lots"], "got 'lots'"),
])
def test_bad_sizes_are_one_line_errors(argv, fragment, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse(argv)
    assert exit_info.value.code == 2 and fragment in capsys.readouterr().err


def test_dtype_half_and_float_are_vllms_spellings():
    assert engine_kwargs(["--dtype", "half"]) == {"dtype": "half"}
    assert EngineConfig.from_kwargs("m", dtype="half").model.dtype == "float16"
    assert EngineConfig.from_kwargs("m", dtype="float").model.dtype == "float32"


def test_several_served_names_and_api_keys():
    config = config_from_args(parse(["m", "--served-model-name", "a", "b", "--api-key", "k1", "k2", "k3"]), {})
    assert config.served_model_names() == ("a", "b") and config.api_keys() == ("k1", "k2", "k3")
    one = config_from_args(parse(["m", "--served-model-name", "a", "--api-key", "k"]), {})
    assert (one.served_model_name, one.api_key) == ("a", "k")  # one value stays a string


def test_no_op_flags_change_nothing():
    argv = ["--enable-chunked-prefill", "--disable-log-stats", "--trust-remote-code",
            "--structured-outputs-config", '{"backend": "guidance", "disable_fallback": true}',
            "--structured-outputs-config.backend", "auto", "--guided-decoding-backend", "guidance:no-fallback",
            "--uvicorn-log-level", "trace", "-pp", "1", "--tokenizer-mode", "auto", "--no-enable-lora",
            "--scheduling-policy", "priority", "--distributed-executor-backend", "mp"]
    config = config_from_args(parse(["m", *argv]), {})
    assert config.engine_kwargs == {} and config == config_from_args(parse(["m"]), {})


@pytest.mark.parametrize("argv, fragment", [
    (["--no-enable-chunked-prefill"], "prefill is always chunked"),
    (["--kv-cache-dtype", "fp8_e5m2"], "e5m2 (more range, fewer mantissa bits) is not implemented"),
    (["-q", "awq"], "invalid choice: 'awq'"),
    (["--reasoning-parser", "deepseek_r1"], "reasoning parsers are not implemented yet"),
    (["--guided-decoding-backend", "xgrammar"], "'xgrammar' is not available: aioinfer's is llguidance"),
    (["--structured-outputs-config.backend", "outlines"], "'outlines' is not available"),
    (["--structured-outputs-config", '{"backend": "lm-format-enforcer"}'], "'lm-format-enforcer' is not available"),
    (["--structured-outputs-config", '{"disable_any_whitespace": true}'], "disable_any_whitespace=True"),
    (["--structured-outputs-config", "guidance"], "must be a JSON object"),
    (["--uvicorn-log-level", "loud"], "--uvicorn-log-level"),
])
def test_flags_aioinfer_would_not_honour_are_refused_with_the_reason(argv, fragment, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse(["m", *argv])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and fragment in err and argv[0] in err


def test_kv_cache_dtype_is_vllms_option():
    for value in ("auto", "fp8", "fp8_e4m3"):
        assert engine_kwargs(["--kv-cache-dtype", value]) == {"kv_cache_dtype": value}


def test_a_refusal_stops_serve_with_one_line(tmp_path):
    result = run_serve([str(tmp_path), "--port", "0", "--kv-cache-dtype", "fp8_e5m2"])
    assert_one_line_error(result, 2, "--kv-cache-dtype", "'fp8_e5m2' is not supported")


def test_structured_outputs_config_sets_the_servers_additional_properties_rule():
    def rule(*argv: str) -> bool:
        return config_from_args(parse(["m", *argv]), {}).disable_additional_properties

    assert rule() is True
    opened = '{"backend": "guidance", "disable_additional_properties": false}'
    assert rule("--structured-outputs-config", opened) is False
    assert rule("--structured-outputs-config", '{"disable_additional_properties": false}',
                "--disable-additional-properties") is True  # the server's own flag wins


def test_llm_takes_the_same_options_with_the_same_reasons():
    assert translate({"structured_outputs_config": {"backend": "guidance"}, "guided_decoding_backend": "auto",
                      "reasoning_parser": "", "enable_chunked_prefill": True}) == {}
    with pytest.raises(ValueError, match="'xgrammar' is not available"):
        translate({"structured_outputs_config": {"backend": "xgrammar"}})
    with pytest.raises(ValueError, match="^reasoning_parser='qwen3' is not supported"):
        translate({"reasoning_parser": "qwen3"})
    assert translate({"structured_outputs_config": {"disable_additional_properties": True}}) == {}
    with pytest.raises(ValueError, match="not supported offline: set it per request"):
        translate({"structured_outputs_config": {"disable_additional_properties": False}})


def test_the_docs_list_every_vllm_flag():
    table = DOCS.read_text()
    for name in [*CHECKED, *(f"--{option.replace('_', '-')}" for option in VLLM_ENGINE_FLAGS),
                 "--uvicorn-log-level", "--enable-ssl-refresh", "--served-model-name NAME [NAME ...]"]:
        assert f"`{name}`" in table or f"`{name}" in table, name


# ---------------------------------------------------------------------------- one real server

# vLLM-style: every flag of the command lines that used to exit 2 (issue 55, item 5).
VLLM_COMMAND_LINE = ["--dtype", "half", "--max-model-len", "2k", "--max-num-batched-tokens", "2K",
                     "--enable-chunked-prefill", "--disable-log-stats", "--served-model-name", "tiny-a", "tiny-b",
                     "--api-key", "key-1", "key-2", "--uvicorn-log-level", "warning",
                     "--structured-outputs-config", '{"backend": "guidance"}', "--guided-decoding-backend", "guidance",
                     "--enable-ssl-refresh", "--enable-force-include-usage", "--trust-remote-code",
                     "--enable-auto-tool-choice", "--tool-call-parser", "llama3_json", "--kv-cache-dtype", "auto"]
MESSAGES = [{"role": "user", "content": "Hello there"}]
CITY = {"type": "object", "properties": {"city": {"type": "string"}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "the weather in a city",
                                           "parameters": CITY}}]


class Served:
    """The running server, its files, and a client that trusts its current certificate."""

    def __init__(self, process: ServerProcess, folder: Path, model_dir: Path) -> None:
        self.process, self.folder, self.model_dir = process, folder, model_dir
        self.url = f"https://127.0.0.1:{process.port}"
        self.trust(folder / "cert.pem")

    def trust(self, cert_file: Path) -> None:
        self.context = ssl.create_default_context(cafile=str(cert_file))

    def post(self, path: str, body: dict, key: str = "key-1") -> httpx.Response:
        return httpx.post(self.url + path, json=body, headers={"Authorization": f"Bearer {key}"},
                          verify=self.context, timeout=60)

    def client(self, key: str = "key-2") -> OpenAI:
        """The openai client; use it in a ``with`` block: a TLS connection left open holds the server's
        exit for asyncio's 30 s SSL shutdown timeout."""
        return OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0,
                      http_client=httpx.Client(verify=self.context, timeout=60))


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tls")
    self_signed(folder)
    model_dir = make_tiny_model_dir(tmp_path_factory.mktemp("qwen2"), arch="qwen2", max_position_embeddings=4096)
    argv = ["{python}", "-m", "aioinfer", "serve", str(model_dir), "--port", "{port}", "--device", "cpu",
            "--num-kv-blocks", "64", "--ssl-certfile", str(folder / "cert.pem"), "--ssl-keyfile",
            str(folder / "key.pem"), *(a.replace("{", "{{").replace("}", "}}") for a in VLLM_COMMAND_LINE)]
    # (ServerProcess fills in {port} and {python}: the JSON's braces are escaped for it)
    server = Served(ServerProcess({}, argv=argv), folder, model_dir)
    try:
        _wait_ready(server)
        yield server
    finally:
        code = server.process.stop()
        server.process.close_log()
    assert code == 0


def _wait_ready(server: Served, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.proc.poll() is not None:
            raise RuntimeError(f"server exited with {server.process.proc.returncode}:\n{server.process.output()}")
        try:
            if httpx.get(server.url + "/ready", verify=server.context, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"server not ready after {timeout} s:\n{server.process.output()}")


def test_the_server_answers_a_vllm_command_line(served):
    with served.client("key-2") as client:
        models = client.models.list().data
        assert [m.id for m in models] == ["tiny-a", "tiny-b"]
        assert {m.model_extra["max_model_len"] for m in models} == {2000}
        reply = client.chat.completions.create(model="tiny-b", messages=MESSAGES, max_tokens=4, temperature=0)
        assert reply.model == "tiny-a" and reply.usage.completion_tokens == 4  # responses carry the first name
        choice = client.completions.create(model="tiny-a", prompt="Hello", max_tokens=3, temperature=0,
                                           extra_body={"structured_outputs": {"choice": ["yes", "no"]}})
        assert choice.choices[0].text in ("yes", "no")  # the structured-outputs backend it was told to use
    with served.client("key-1") as client:
        assert client.models.list().data
    with served.client("key-3") as client, pytest.raises(AuthenticationError):
        client.models.list()
    log = served.process.output()
    assert "engine ready" in log and "Running on" not in log  # hypercorn's info line, below --uvicorn-log-level


def test_forced_usage_is_on_every_chunk(served):
    """--enable-force-include-usage, as vLLM's: usage on every chunk and a usage chunk at the end, with
    or without stream_options."""
    with served.client() as client:
        _forced_usage(client)


def _forced_usage(client: OpenAI) -> None:
    for stream_options in (None, {"include_usage": False}):
        extra = {"extra_body": {"return_token_ids": True}}  # each chunk's tokens, to count them
        if stream_options is not None:
            extra["stream_options"] = stream_options
        chat = list(client.chat.completions.create(model="tiny-a", messages=MESSAGES, max_tokens=4, temperature=0,
                                                   stream=True, **extra))
        completion = list(client.completions.create(model="tiny-a", prompt="Hello", max_tokens=4, temperature=0,
                                                    stream=True, **extra))
        for chunks in (chat, completion):
            assert all(chunk.usage is not None for chunk in chunks)
            sent = 0  # every chunk's usage counts the tokens sent up to it
            for chunk in chunks[:-1]:
                sent += len(chunk.choices[0].model_extra.get("token_ids") or [])
                assert chunk.usage.completion_tokens == sent
            assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == sent == 4


def test_tokenize_takes_vllms_chat_fields(served):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(served.model_dir)
    conversation = [*MESSAGES, {"role": "assistant", "content": "Sure,"}]
    for add_special in (False, True):
        body = {"model": "tiny-b", "messages": conversation, "add_generation_prompt": False,
                "continue_final_message": True, "add_special_tokens": add_special,
                "chat_template_kwargs": {"unused": 1}}
        text = tokenizer.apply_chat_template(conversation, add_generation_prompt=False, continue_final_message=True,
                                             tokenize=False)
        want = tokenizer.encode(text, add_special_tokens=add_special)
        got = served.post("/tokenize", body)
        assert got.status_code == 200 and got.json()["tokens"] == want, got.text
    # with tools: the prompt a chat request with the same messages and tools is given
    tokens = served.post("/tokenize", {"messages": MESSAGES, "tools": TOOLS}).json()
    with served.client() as client:
        chat = client.chat.completions.create(model="tiny-a", messages=MESSAGES, tools=TOOLS, tool_choice="none",
                                              max_tokens=1, temperature=0)
    plain = served.post("/tokenize", {"messages": MESSAGES}).json()
    assert tokens["count"] == chat.usage.prompt_tokens > plain["count"]
    both = served.post("/tokenize", {"messages": conversation, "continue_final_message": True})
    assert both.status_code == 400 and both.json()["error"]["param"] == "continue_final_message"


def test_unasked_vllm_fields_are_null_not_absent(served):
    chat = served.post("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 2, "temperature": 0}).json()
    assert chat["prompt_logprobs"] is None and chat["prompt_token_ids"] is None
    assert chat["choices"][0]["token_ids"] is None
    completion = served.post("/v1/completions", {"prompt": "Hello", "max_tokens": 2, "temperature": 0}).json()
    choice = completion["choices"][0]
    assert choice["prompt_logprobs"] is None and choice["prompt_token_ids"] is None and choice["token_ids"] is None
    # the openai client reads them as None (an absent field is an AttributeError there)
    with served.client() as client:
        assert client.chat.completions.create(model="tiny-a", messages=MESSAGES, max_tokens=2).prompt_logprobs is None
        completion = client.completions.create(model="tiny-a", prompt="Hi", max_tokens=2)
        assert completion.choices[0].prompt_token_ids is None
    asked = served.post("/v1/completions", {"prompt": "Hello", "max_tokens": 2, "prompt_logprobs": 0,
                                            "return_token_ids": True}).json()["choices"][0]
    assert len(asked["prompt_logprobs"]) == len(asked["prompt_token_ids"]) and len(asked["token_ids"]) == 2


def test_the_chosen_token_comes_first_in_top_logprobs(served):
    """vLLM's order: the chosen token, then the most likely others. A logit bias makes the chosen token
    one the model ranks 5th (logprobs are the unbiased model's, as vLLM's)."""
    first = {"prompt": "Hello", "max_tokens": 1, "temperature": 0, "return_tokens_as_token_ids": True}
    ranked = list(served.post("/v1/completions", {**first, "logprobs": 5}).json()["choices"][0]["logprobs"]
                  ["top_logprobs"][0])
    assert len(ranked) == 5
    fifth = ranked[4]
    biased = {**first, "logit_bias": {fifth.split(":")[1]: 100}}
    lp = served.post("/v1/completions", {**biased, "logprobs": 2}).json()["choices"][0]["logprobs"]
    assert lp["tokens"] == [fifth] and list(lp["top_logprobs"][0]) == [fifth, *ranked[:2]]  # N + 1 keys
    assert lp["token_logprobs"][0] < lp["top_logprobs"][0][ranked[0]]  # chosen, though not the most likely
    chat = served.post("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 1, "temperature": 0,
                                                "logprobs": True, "top_logprobs": 5,
                                                "return_tokens_as_token_ids": True}).json()
    top = [t["token"] for t in chat["choices"][0]["logprobs"]["content"][0]["top_logprobs"]]
    bias = {"logit_bias": {top[4].split(":")[1]: 100}}
    chat = served.post("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 1, "temperature": 0,
                                                "logprobs": True, "top_logprobs": 3,
                                                "return_tokens_as_token_ids": True, **bias}).json()
    content = chat["choices"][0]["logprobs"]["content"][0]
    # N entries: the chosen token takes the place of the N-th most likely (vLLM's rule)
    assert content["token"] == top[4] and [t["token"] for t in content["top_logprobs"]] == [top[4], *top[:2]]


def test_a_renewed_certificate_is_served_without_a_restart(served):
    """--enable-ssl-refresh: new files at the same paths are served to the next connections. Last in
    this module: the other tests trust the first certificate."""
    cert_file = served.folder / "cert.pem"
    old = ssl.PEM_cert_to_DER_cert(cert_file.read_text())
    assert ssl.PEM_cert_to_DER_cert(ssl.get_server_certificate(("127.0.0.1", served.process.port))) == old
    renewed = served.folder / "renewed"
    renewed.mkdir()
    new_cert, new_key = self_signed(renewed)
    os.replace(new_cert, cert_file)  # the certificate first: for a moment it does not fit the old key
    os.replace(new_key, served.folder / "key.pem")
    new = ssl.PEM_cert_to_DER_cert(cert_file.read_text())
    deadline = time.monotonic() + 60
    while ssl.PEM_cert_to_DER_cert(ssl.get_server_certificate(("127.0.0.1", served.process.port))) != new:
        assert time.monotonic() < deadline, "the renewed certificate was not served:\n" + served.process.output()
        time.sleep(0.2)
    served.trust(cert_file)
    with served.client() as client:
        reply = client.chat.completions.create(model="tiny-a", messages=MESSAGES, max_tokens=2)
        assert reply.usage.completion_tokens == 2
    assert json.loads(served.post("/tokenize", {"prompt": "Hi"}).text)["count"] > 0
