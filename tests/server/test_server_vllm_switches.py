"""vLLM's server switches --enable-request-id-headers, --enable-force-include-usage and
--enable-tokenizer-info-endpoint, through the serve CLI with the real openai client; and their
defaults (all off) under plain hypercorn."""

from __future__ import annotations

import re

import httpx
import pytest
from openai import OpenAI

from aioinfer import LLM
from server_process import run_server
from tiny_models import make_tiny_model_dir

ENGINE_ENV = {"AIOINFER_DTYPE": "float32", "AIOINFER_DEVICE": "cpu", "AIOINFER_MAX_MODEL_LEN": "256",
              "AIOINFER_NUM_KV_BLOCKS": "64", "AIOINFER_BLOCK_SIZE": "16"}

# Room for a prompt with a tool (the tools' system message takes ~470 tokens of the tiny tokenizer).
SWITCHES_ENV = {**ENGINE_ENV, "AIOINFER_MAX_MODEL_LEN": "512"}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(make_tiny_model_dir(tmp_path_factory.mktemp("qwen2"), arch="qwen2"))


def _usage_chunks(stream) -> list:
    return [chunk.usage for chunk in stream if chunk.usage is not None]


CUSTOM_TEMPLATE = ("{% for m in messages %}[custom] {{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                   "{% if add_generation_prompt %}[custom] assistant:{% endif %}")


def test_switches_on(model_dir, tmp_path):
    template_file = tmp_path / "template.jinja"
    template_file.write_text(CUSTOM_TEMPLATE)
    argv = ["{python}", "-m", "aioinfer", "serve", model_dir, "--port", "{port}", "--enable-request-id-headers",
            "--enable-force-include-usage", "--enable-tokenizer-info-endpoint", "--return-tokens-as-token-ids",
            "--enforce-strict-tools", "--chat-template", str(template_file)]
    with run_server(SWITCHES_ENV, argv=argv) as server:
        client = OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
        model = client.models.list().data[0].id

        # request ids: the client's comes back; without one, a fresh id on every response
        raw = client.completions.with_raw_response.create(model=model, prompt="Hello", max_tokens=3,
                                                          extra_headers={"X-Request-Id": "trace-42"})
        assert raw.headers["x-request-id"] == "trace-42"
        fresh = {httpx.get(server.url + "/v1/models").headers["x-request-id"] for _ in range(2)}
        assert len(fresh) == 2 and all(re.fullmatch(r"[0-9a-f]{32}", rid) for rid in fresh)
        assert httpx.get(server.url + "/health").headers["x-request-id"]

        # usage on every chunk of every stream, asked for or not, and a usage chunk at its end (vLLM's)
        completion = list(client.completions.create(model=model, prompt="Hello", max_tokens=5, stream=True))
        assert len(_usage_chunks(completion)) == len(completion) and not completion[-1].choices
        assert completion[-1].usage.completion_tokens == 5
        chat = list(client.chat.completions.create(model=model, max_tokens=4, stream=True,
                                                   messages=[{"role": "user", "content": "Hi"}]))
        assert len(_usage_chunks(chat)) == len(chat) and chat[-1].usage.completion_tokens == 4
        # as with stream_options asking for both
        both = list(client.completions.create(model=model, prompt="Hello", max_tokens=3, stream=True,
                                              stream_options={"include_usage": True},
                                              extra_body={"stream_options": {"include_usage": True,
                                                                             "continuous_usage_stats": True}}))
        assert len(_usage_chunks(both)) == len(both)

        # logprobs name tokens by id (the server's default), unless the request says otherwise
        by_id = client.completions.create(model=model, prompt="Hello", max_tokens=4, logprobs=2, temperature=0)
        assert all(re.fullmatch(r"token_id:\d+", t) for t in by_id.choices[0].logprobs.tokens)
        by_text = client.completions.create(model=model, prompt="Hello", max_tokens=4, logprobs=2, temperature=0,
                                            extra_body={"return_tokens_as_token_ids": False})
        assert not any(re.fullmatch(r"token_id:\d+", t) for t in by_text.choices[0].logprobs.tokens)

        # the tokenizer's configuration, as its tokenizer_config.json holds it
        info = httpx.get(server.url + "/tokenizer_info")
        assert info.status_code == 200, info.text
        info = info.json()
        llm = LLM(model=model_dir, device="cpu", dtype="float32", max_model_len=256, num_kv_blocks=16)
        tokenizer = llm.get_tokenizer()
        assert info["tokenizer_class"] == type(tokenizer).__name__
        assert info["chat_template"] == CUSTOM_TEMPLATE  # --chat-template's, not the tokenizer's

        # --chat-template renders chats and /tokenize's messages, as LLM.chat(chat_template=...) does
        messages = [{"role": "user", "content": "Hi there"}]
        from aioinfer import SamplingParams

        offline = llm.chat(messages, SamplingParams(max_tokens=4, temperature=0), chat_template=CUSTOM_TEMPLATE,
                           use_tqdm=False)[0]
        assert offline.prompt.startswith("[custom] user: Hi there")
        tokenized = httpx.post(server.url + "/tokenize", json={"messages": messages}).json()
        assert tokenized["tokens"] == offline.prompt_token_ids
        chat = client.chat.completions.create(model=model, messages=messages, max_tokens=4, temperature=0)
        assert chat.usage.prompt_tokens == len(offline.prompt_token_ids)
        assert chat.choices[0].message.content == offline.outputs[0].text
        assert info["eos_token"] == tokenizer.eos_token
        added = info["added_tokens_decoder"]
        assert added and all(key.isdigit() and {"content", "special"} <= set(token) for key, token in added.items())
        assert {int(key): token["content"] for key, token in added.items()} == {
            token_id: token.content for token_id, token in tokenizer.added_tokens_decoder.items()}

        # --enforce-strict-tools: a strict function's schema is compiled into an "auto" request's
        # grammar, so one the grammar engine cannot take is a 400 (off, the same request is answered)
        refused = _strict_tool_request(server)
        assert refused.status_code == 400 and "unclosed group" in refused.json()["error"]["message"], refused.text
        answered = _strict_tool_request(server, strict=False)
        assert answered.status_code == 200, answered.text


def test_switches_off_by_default(model_dir):
    with run_server({**SWITCHES_ENV, "AIOINFER_MODEL": model_dir}) as server:  # plain hypercorn
        client = OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
        model = client.models.list().data[0].id
        raw = client.completions.with_raw_response.create(model=model, prompt="Hello", max_tokens=3,
                                                          extra_headers={"X-Request-Id": "trace-42"})
        assert raw.headers["x-request-id"] == "cmpl-trace-42" == raw.parse().id  # aioinfer's own: the response id
        assert "x-request-id" not in httpx.get(server.url + "/v1/models").headers
        stream = list(client.completions.create(model=model, prompt="Hello", max_tokens=3, stream=True))
        assert _usage_chunks(stream) == []
        missing = httpx.get(server.url + "/tokenizer_info")
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
        answered = _strict_tool_request(server)
        assert answered.status_code == 200, answered.text


def _strict_tool_request(server, strict: bool = True) -> httpx.Response:
    """A chat request under "auto" whose function's schema has a regex the grammar engine refuses."""
    parameters = {"type": "object", "properties": {"code": {"type": "string", "pattern": "(unclosed"}}}
    tool = {"type": "function", "function": {"name": "lookup", "parameters": parameters, "strict": strict}}
    return httpx.post(server.url + "/v1/chat/completions", timeout=60, json={
        "messages": [{"role": "user", "content": "Hi"}], "tools": [tool], "max_tokens": 3})


def _ids(tokens: list[str]) -> list[int]:
    assert all(re.fullmatch(r"token_id:\d+", token) for token in tokens), tokens
    return [int(token.split(":")[1]) for token in tokens]


def test_return_tokens_as_token_ids(model_dir):
    """vLLM's request field: every logprobs token (sampled and top) named "token_id:<id>", the ids the
    offline engine samples; completions and chat, streamed and not."""
    from aioinfer import SamplingParams

    llm = LLM(model=model_dir, device="cpu", dtype="float32", max_model_len=256, num_kv_blocks=16)
    with run_server({**ENGINE_ENV, "AIOINFER_MODEL": model_dir}) as server:
        client = OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
        model = client.models.list().data[0].id
        extra = {"return_tokens_as_token_ids": True}
        want = llm.generate(["Hello"], SamplingParams(max_tokens=6, temperature=0), use_tqdm=False)[0].outputs[0]
        full = client.completions.create(model=model, prompt="Hello", max_tokens=6, logprobs=3, temperature=0,
                                         extra_body=extra).choices[0].logprobs
        assert _ids(full.tokens) == list(want.token_ids)
        assert all(_ids(list(top)) for top in full.top_logprobs)
        streamed = [chunk.choices[0].logprobs for chunk in client.completions.create(
            model=model, prompt="Hello", max_tokens=6, logprobs=3, temperature=0, stream=True, extra_body=extra)
            if chunk.choices and chunk.choices[0].logprobs is not None]
        assert _ids([t for part in streamed for t in part.tokens]) == list(want.token_ids)

        messages = [{"role": "user", "content": "Hi"}]
        ids = llm.chat(messages, SamplingParams(max_tokens=5, temperature=0), use_tqdm=False)[0].outputs[0].token_ids
        chat = client.chat.completions.create(model=model, messages=messages, max_tokens=5, temperature=0,
                                              logprobs=True, top_logprobs=2, extra_body=extra)
        content = chat.choices[0].logprobs.content
        assert _ids([c.token for c in content]) == list(ids)
        assert all(bytes(c.bytes).decode() == c.token for c in content)
        assert all(_ids([top.token for top in c.top_logprobs]) for c in content)
        chunks = client.chat.completions.create(model=model, messages=messages, max_tokens=5, temperature=0,
                                                logprobs=True, stream=True, extra_body=extra)
        tokens = [c.token for chunk in chunks if chunk.choices and chunk.choices[0].logprobs
                  for c in chunk.choices[0].logprobs.content]
        assert _ids(tokens) == list(ids)


def test_switches_from_the_environment():
    from aioinfer.server_config import ServerConfig

    config = ServerConfig.from_env({"AIOINFER_ENABLE_REQUEST_ID_HEADERS": "true",
                                    "AIOINFER_ENABLE_FORCE_INCLUDE_USAGE": "1",
                                    "AIOINFER_ENABLE_TOKENIZER_INFO_ENDPOINT": "yes"})
    assert config.enable_request_id_headers and config.enable_force_include_usage
    assert config.enable_tokenizer_info_endpoint
    assert not ServerConfig.from_env({}).enable_request_id_headers
    assert ServerConfig(chat_template="{{ messages }}").resolved_chat_template() == "{{ messages }}"
    with pytest.raises(ValueError, match="neither a file nor a Jinja template"):
        ServerConfig(chat_template="/no/such/template.jinja")
