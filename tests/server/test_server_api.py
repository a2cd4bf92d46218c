"""The OpenAI-compatible server as a real process, driven by the official ``openai`` client.

One ``hypercorn aioinfer.app:app`` process on a tiny random Qwen2 model for the whole module;
every answer is compared with the offline ``LLM`` given the same request.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest
from openai import AsyncOpenAI, OpenAI

from aioinfer import LLM, SamplingParams
from server_process import metric, metric_samples, start_server
from tiny_models import make_tiny_model_dir

MAX_MODEL_LEN = 256
ENGINE_OPTIONS = dict(dtype="float32", device="cpu", max_model_len=MAX_MODEL_LEN, block_size=16, num_kv_blocks=256)
PROMPTS = ["Hello, world! How are you", "我们今天去公园散步，", "Emoji test: 😀 🚀", "The quick brown fox"]
CHATS = [[{"role": "user", "content": "你好，世界！"}],
         [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Emoji 🎉 please"}]]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(make_tiny_model_dir(tmp_path_factory.mktemp("qwen2"), arch="qwen2"))


@pytest.fixture(scope="module")
def server(model_dir):
    env = {"AIOINFER_" + k.upper(): str(v) for k, v in ENGINE_OPTIONS.items()}
    env.update(AIOINFER_MODEL=model_dir, AIOINFER_MAX_BODY_BYTES="200000", AIOINFER_MAX_N="8")
    proc = start_server(env)
    yield proc
    assert proc.stop() == 0, proc.output()
    assert '"event":"request"' in proc.output()  # the structured request log was written
    proc.close_log()


@pytest.fixture(scope="module")
def llm(model_dir):
    return LLM(model=model_dir, **ENGINE_OPTIONS)


@pytest.fixture(scope="module")
def client(server):
    return OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def model_name(client):
    return client.models.list().data[0].id


def sampling(llm, **params) -> SamplingParams:
    """Like the server (and vLLM), fields a request leaves out take the model's generation_config.json
    defaults (the tiny model's: temperature 0.7, top_p 0.8, top_k 20)."""
    defaults = llm.get_default_sampling_params()
    merged = {"temperature": defaults.temperature, "top_p": defaults.top_p, "top_k": defaults.top_k,
              "min_p": defaults.min_p, "repetition_penalty": defaults.repetition_penalty, **params}
    return SamplingParams(**merged)


def offline(llm, prompts, **params):
    return llm.generate(prompts, sampling(llm, **params), use_tqdm=False)


# ---------------------------------------------------------------------------- equality with the offline LLM

@pytest.mark.parametrize("params", [dict(temperature=0.0), dict(temperature=0.9, top_p=0.9, top_k=50, seed=11)])
def test_completions_equal_offline(client, model_name, llm, params):
    expected = offline(llm, PROMPTS, max_tokens=12, **params)
    for prompt, want in zip(PROMPTS, expected):
        got = client.completions.create(model=model_name, prompt=prompt, max_tokens=12,
                                        extra_body={"top_k": params.get("top_k", 0)},
                                        **{k: v for k, v in params.items() if k != "top_k"})
        choice = got.choices[0]
        assert choice.text == want.outputs[0].text
        assert choice.finish_reason == want.outputs[0].finish_reason
        assert got.usage.prompt_tokens == len(want.prompt_token_ids)
        assert got.usage.completion_tokens == len(want.outputs[0].token_ids)
        assert got.id.startswith("cmpl-") and got.object == "text_completion"


def test_several_prompts_token_ids_and_n(client, model_name, llm):
    ids = llm.get_tokenizer().encode("Once upon a time")
    got = client.completions.create(model=model_name, prompt=[PROMPTS[0], PROMPTS[1]], n=2, max_tokens=8,
                                    temperature=1.0, seed=5)
    want = offline(llm, [PROMPTS[0], PROMPTS[1]], n=2, max_tokens=8, temperature=1.0, seed=5)
    assert [c.index for c in got.choices] == [0, 1, 2, 3]
    assert [c.text for c in got.choices] == [o.text for w in want for o in w.outputs]
    assert got.usage.prompt_tokens == sum(len(w.prompt_token_ids) for w in want)  # each prompt once, not n times
    by_ids = client.completions.create(model=model_name, prompt=ids, max_tokens=8, temperature=0)
    assert by_ids.choices[0].text == offline(llm, [ids], max_tokens=8, temperature=0)[0].outputs[0].text
    batch = client.completions.create(model=model_name, prompt=[ids, ids[:2]], max_tokens=4, temperature=0)
    assert len(batch.choices) == 2


@pytest.mark.parametrize("params", [dict(temperature=0.0), dict(temperature=0.8, seed=3, n=3)])
def test_chat_equals_offline(client, model_name, llm, params):
    for messages in CHATS:
        want = llm.chat(messages, sampling(llm, max_tokens=10, **params), use_tqdm=False)[0]
        got = client.chat.completions.create(model=model_name, messages=messages, max_tokens=10, **params)
        assert [c.message.content for c in got.choices] == [o.text for o in want.outputs]
        assert [c.finish_reason for c in got.choices] == [o.finish_reason for o in want.outputs]
        assert got.choices[0].message.role == "assistant" and got.object == "chat.completion"
        assert got.usage.prompt_tokens == len(want.prompt_token_ids)


def test_chat_custom_role_goes_to_the_template(client, model_name, llm):
    """vLLM's custom roles: a role outside OpenAI's five is rendered by the chat template as it is,
    text content or text parts alike, and the reply equals the offline chat's."""
    as_text = [{"role": "my-custom-role", "content": "what is 1+1?"}]
    as_parts = [{"role": "my-custom-role", "content": [{"type": "text", "text": "what is 1+1?"}]}]
    want = llm.chat(as_text, sampling(llm, max_tokens=8, temperature=0.0), use_tqdm=False)[0]
    assert "my-custom-role" in want.prompt
    replies = [client.chat.completions.create(model=model_name, messages=m, max_tokens=8, temperature=0)
               for m in (as_text, as_parts)]
    assert [r.choices[0].message.content for r in replies] == [want.outputs[0].text] * 2
    assert replies[0].usage.prompt_tokens == len(want.prompt_token_ids)


def test_streamed_text_equals_full_text(client, model_name):
    for prompt in PROMPTS:
        args = dict(model=model_name, prompt=prompt, max_tokens=20, temperature=0.7, seed=1)
        full = client.completions.create(**args).choices[0]
        chunks = list(client.completions.create(stream=True, **args))
        assert "".join(c.choices[0].text for c in chunks) == full.text
        assert chunks[-1].choices[0].finish_reason == full.finish_reason
    for messages in CHATS:
        args = dict(model=model_name, messages=messages, max_tokens=20, temperature=0.7, seed=2, n=2)
        full = client.chat.completions.create(**args)
        texts = {0: "", 1: ""}
        for chunk in client.chat.completions.create(stream=True, **args):
            for c in chunk.choices:
                texts[c.index] += c.delta.content or ""
        assert [texts[0], texts[1]] == [c.message.content for c in full.choices]


def test_async_client_concurrent_stream_and_full(server, model_name, llm):
    want = offline(llm, PROMPTS, max_tokens=16, temperature=0)

    async def main():
        async with AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as aclient:
            async def streamed(prompt):
                text = ""
                async for chunk in await aclient.completions.create(model=model_name, prompt=prompt, max_tokens=16,
                                                                    temperature=0, stream=True):
                    text += chunk.choices[0].text
                return text

            async def full(prompt):
                out = await aclient.completions.create(model=model_name, prompt=prompt, max_tokens=16, temperature=0)
                return out.choices[0].text

            async def chat():
                out = await aclient.chat.completions.create(model=model_name, messages=CHATS[0], max_tokens=8,
                                                            temperature=0)
                return out.choices[0].message.content

            return await asyncio.gather(*[streamed(p) for p in PROMPTS], *[full(p) for p in PROMPTS], chat())

    results = asyncio.run(main())
    texts = [w.outputs[0].text for w in want]
    assert results[:4] == texts and results[4:8] == texts
    assert results[8] == llm.chat(CHATS[0], SamplingParams(max_tokens=8, temperature=0), use_tqdm=False)[0].outputs[0].text


# ---------------------------------------------------------------------------- parameters

def test_logprobs(client, model_name, llm):
    want = offline(llm, [PROMPTS[0]], max_tokens=6, temperature=0, logprobs=2)[0].outputs[0]
    got = client.completions.create(model=model_name, prompt=PROMPTS[0], max_tokens=6, temperature=0, logprobs=2)
    lp = got.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 6
    assert lp.token_logprobs == pytest.approx([e[t].logprob for e, t in zip(want.logprobs, want.token_ids)], abs=1e-5)
    assert all(2 <= len(top) <= 3 for top in lp.top_logprobs)
    chat = client.chat.completions.create(model=model_name, messages=CHATS[0], max_tokens=5, temperature=0,
                                          logprobs=True, top_logprobs=3)
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens
    assert all(len(c.top_logprobs) == 3 and c.bytes == list(c.token.encode()) for c in content)
    assert content[0].logprob == pytest.approx(chat.choices[0].logprobs.content[0].top_logprobs[0].logprob)


def test_usage_chunk_echo_stop(client, model_name, llm):
    chunks = list(client.chat.completions.create(model=model_name, messages=CHATS[1], max_tokens=7, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 7
    # Whole blocks of 16 only, and never the block of the last prompt token (exact values: test_prefix_cache_usage).
    cached, prompt_tokens = chunks[-1].usage.prompt_tokens_details.cached_tokens, chunks[-1].usage.prompt_tokens
    assert cached % 16 == 0 and cached <= (prompt_tokens - 1) // 16 * 16
    echo = client.completions.create(model=model_name, prompt=PROMPTS[3], max_tokens=5, temperature=0, echo=True)
    plain = client.completions.create(model=model_name, prompt=PROMPTS[3], max_tokens=5, temperature=0)
    assert echo.choices[0].text == PROMPTS[3] + plain.choices[0].text
    # A stop string taken from the greedy text ends it there, as offline.
    full = offline(llm, [PROMPTS[0]], max_tokens=16, temperature=0, ignore_eos=True)[0].outputs[0].text
    stop = full[4:6]
    want = offline(llm, [PROMPTS[0]], max_tokens=16, temperature=0, ignore_eos=True, stop=[stop])[0].outputs[0]
    got = client.completions.create(model=model_name, prompt=PROMPTS[0], max_tokens=16, temperature=0, stop=[stop],
                                    extra_body={"ignore_eos": True}).choices[0]
    assert (got.text, got.finish_reason, got.model_extra["stop_reason"]) == (want.text, "stop", stop)


def test_prefix_cache_usage(server, client, model_name):
    """cached_tokens: 0 for a new prompt, its whole blocks but the last token's on a repeat (block_size 16),
    for completions and chat, streamed or not, with the same text; another cache_salt never shares."""
    import uuid

    before = metric_samples(server)
    prompt = uuid.uuid4().hex + " The quick brown fox jumps over the lazy dog." * 3  # new to this server
    ask = dict(model=model_name, prompt=prompt, max_tokens=6, temperature=0)
    cold = client.completions.create(**ask)
    n = cold.usage.prompt_tokens
    warm_tokens = (n - 1) // 16 * 16
    assert warm_tokens >= 32 and cold.usage.prompt_tokens_details.cached_tokens == 0
    warm = client.completions.create(**ask)
    assert warm.usage.prompt_tokens_details.cached_tokens == warm_tokens
    assert warm.choices[0].text == cold.choices[0].text
    chunks = list(client.completions.create(**ask, stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == warm_tokens
    assert "".join(c.choices[0].text for c in chunks if c.choices) == cold.choices[0].text
    # Another tenant: nothing shared at first, its own blocks afterwards; priority is accepted alongside.
    salted = [client.completions.create(**ask, extra_body={"cache_salt": "tenant-b", "priority": p}) for p in (3, -2)]
    assert [s.usage.prompt_tokens_details.cached_tokens for s in salted] == [0, warm_tokens]
    assert {s.choices[0].text for s in salted} == {cold.choices[0].text}

    messages = [{"role": "user", "content": prompt}]
    chat_cold = client.chat.completions.create(model=model_name, messages=messages, max_tokens=6, temperature=0)
    assert chat_cold.usage.prompt_tokens_details.cached_tokens == 0
    chunks = list(client.chat.completions.create(model=model_name, messages=messages, max_tokens=6, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == (chat_cold.usage.prompt_tokens - 1) // 16 * 16
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == \
        chat_cold.choices[0].message.content
    # Prometheus counts tokens: 5 completions and 2 chats looked up, 3 + 1 of them hit.
    after = metric_samples(server)
    m = chat_cold.usage.prompt_tokens
    assert metric(after, "vllm:prefix_cache_queries_total") - metric(before, "vllm:prefix_cache_queries_total") == \
        5 * n + 2 * m
    assert metric(after, "vllm:prefix_cache_hits_total") - metric(before, "vllm:prefix_cache_hits_total") == \
        3 * warm_tokens + (m - 1) // 16 * 16


def test_default_max_tokens(client, model_name):
    # vLLM's defaults: 16 for completions, the rest of the context for chat.
    got = client.completions.create(model=model_name, prompt=PROMPTS[0], temperature=0, extra_body={"ignore_eos": True})
    assert got.usage.completion_tokens == 16
    chat = client.chat.completions.create(model=model_name, messages=CHATS[0], temperature=0,
                                          extra_body={"ignore_eos": True})
    assert chat.usage.prompt_tokens + chat.usage.completion_tokens == MAX_MODEL_LEN
    assert chat.choices[0].finish_reason == "length"


def test_models_version_tokenize_detokenize(server, client, model_name, llm):
    models = client.models.list().data
    assert len(models) == 1 and models[0].owned_by == "aioinfer" and models[0].model_extra["max_model_len"] == MAX_MODEL_LEN
    assert models[0].model_extra["quantization"] is None  # plain weights
    assert models[0].model_extra["kv_cache_dtype"] == "auto"
    assert httpx.get(server.url + "/version").json()["version"]
    tok = httpx.post(server.url + "/tokenize", json={"prompt": PROMPTS[1]}).json()
    assert tok["tokens"] == llm.get_tokenizer().encode(PROMPTS[1]) and tok["count"] == len(tok["tokens"])
    assert tok["max_model_len"] == MAX_MODEL_LEN
    chat_tok = httpx.post(server.url + "/tokenize", json={"messages": CHATS[0]}).json()
    assert chat_tok["count"] == client.chat.completions.create(model=model_name, messages=CHATS[0], max_tokens=1,
                                                               temperature=0).usage.prompt_tokens
    detok = httpx.post(server.url + "/detokenize", json={"model": model_name, "tokens": tok["tokens"]}).json()
    assert detok == {"prompt": PROMPTS[1]}


# ---------------------------------------------------------------------------- errors

def _table(model_len: int) -> list[tuple[str, str, object, int, str | None]]:
    """(id, path, body (dict, or raw bytes), expected status, expected param)."""
    c, ch = "/v1/completions", "/v1/chat/completions"
    msg = [{"role": "user", "content": "hi"}]
    long_prompt = list(range(5, 5 + model_len))
    return [
        ("bad-json", c, b'{"prompt": ', 400, None),
        ("not-an-object", c, b"[1, 2]", 400, None),
        ("empty-body", c, b"", 400, None),
        ("invalid-utf8", c, b'{"prompt": "\xff\xfe"}', 400, None),
        ("not-supported-yet", c, {"prompt": "hi", "bad_words": ["x"]}, 400, "bad_words"),
        ("chat-not-supported-yet", ch, {"messages": msg, "kv_transfer_params": {}}, 400, "kv_transfer_params"),
        ("missing-prompt", c, {"max_tokens": 3}, 400, "prompt"),
        ("prompt-number", c, {"prompt": 123}, 400, "prompt"),
        ("prompt-mixed-list", c, {"prompt": [1, "a"]}, 400, "prompt"),
        ("prompt-empty-list", c, {"prompt": []}, 400, "prompt"),
        ("prompt-token-out-of-vocab", c, {"prompt": [10**6]}, 400, "prompt"),
        ("max-tokens-string", c, {"prompt": "hi", "max_tokens": "ten"}, 400, "max_tokens"),
        ("max-tokens-zero", c, {"prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
        ("max-tokens-float", c, {"prompt": "hi", "max_tokens": 1.5}, 400, "max_tokens"),
        ("temperature-negative", c, {"prompt": "hi", "temperature": -1}, 400, "temperature"),
        ("temperature-string", c, {"prompt": "hi", "temperature": "hot"}, 400, "temperature"),
        ("top-p-zero", c, {"prompt": "hi", "top_p": 0}, 400, "top_p"),
        ("top-p-above-one", c, {"prompt": "hi", "top_p": 1.5}, 400, "top_p"),
        ("top-k-below-minus-one", c, {"prompt": "hi", "top_k": -2}, 400, "top_k"),
        ("min-p-above-one", c, {"prompt": "hi", "min_p": 2}, 400, "min_p"),
        ("n-zero", c, {"prompt": "hi", "n": 0}, 400, "n"),
        ("n-above-limit", c, {"prompt": "hi", "n": 9}, 400, "n"),
        ("presence-penalty", c, {"prompt": "hi", "presence_penalty": 3}, 400, "presence_penalty"),
        ("frequency-penalty", c, {"prompt": "hi", "frequency_penalty": -2.5}, 400, "frequency_penalty"),
        ("repetition-penalty", c, {"prompt": "hi", "repetition_penalty": 0}, 400, "repetition_penalty"),
        ("logprobs-too-many", c, {"prompt": "hi", "logprobs": 21}, 400, "logprobs"),
        ("logit-bias-key", c, {"prompt": "hi", "logit_bias": {"abc": 1}}, 400, "logit_bias"),
        ("logit-bias-value", c, {"prompt": "hi", "logit_bias": {"5": 500}}, 400, "logit_bias"),
        ("logit-bias-out-of-vocab", c, {"prompt": "hi", "logit_bias": {"100000": 1}}, 400, None),
        ("stop-empty-string", c, {"prompt": "hi", "stop": [""]}, 400, "stop"),
        ("stop-number", c, {"prompt": "hi", "stop": 5}, 400, "stop"),
        ("stop-token-negative", c, {"prompt": "hi", "stop_token_ids": [-1]}, 400, "stop_token_ids"),
        ("stop-token-out-of-vocab", c, {"prompt": "hi", "stop_token_ids": [100000]}, 400, None),
        ("seed-string", c, {"prompt": "hi", "seed": "abc"}, 400, "seed"),
        ("stream-string", c, {"prompt": "hi", "stream": "yes"}, 400, "stream"),
        ("stream-options-unknown", c, {"prompt": "hi", "stream": True, "stream_options": {"x": 1}}, 400,
         "stream_options.x"),
        ("suffix", c, {"prompt": "hi", "suffix": "end"}, 400, "suffix"),
        ("best-of", c, {"prompt": "hi", "best_of": 3}, 400, "best_of"),
        ("prompt-logprobs-streamed", c, {"prompt": "hi", "prompt_logprobs": 1, "stream": True}, 400,
         "prompt_logprobs"),
        ("min-tokens-above-max", c, {"prompt": "hi", "max_tokens": 2, "min_tokens": 5}, 400, "min_tokens"),
        ("priority-string", c, {"prompt": "hi", "priority": "high"}, 400, "priority"),
        ("cache-salt-empty", c, {"prompt": "hi", "cache_salt": ""}, 400, "cache_salt"),
        ("chat-cache-salt-number", ch, {"messages": msg, "cache_salt": 7}, 400, "cache_salt"),
        ("prompt-too-long", c, {"prompt": long_prompt, "max_tokens": 1}, 400, None),
        ("prompt-plus-max-tokens-too-long", c, {"prompt": "hi", "max_tokens": model_len}, 400, None),
        ("unknown-model", c, {"model": "gpt-9", "prompt": "hi"}, 404, "model"),
        ("chat-no-messages", ch, {"messages": []}, 400, "messages"),
        ("chat-empty-role", ch, {"messages": [{"role": "", "content": "hi"}]}, 400, "messages.0.role"),
        ("chat-role-not-a-string", ch, {"messages": [{"role": 3, "content": "hi"}]}, 400, "messages.0.role"),
        ("chat-image-part", ch, {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
         400, None),
        ("chat-top-logprobs-without-logprobs", ch, {"messages": msg, "top_logprobs": 2}, 400, "top_logprobs"),
        ("chat-top-logprobs-too-many", ch, {"messages": msg, "logprobs": True, "top_logprobs": 30}, 400, "top_logprobs"),
        ("chat-tools-empty", ch, {"messages": msg, "tools": []}, 400, "tools"),
        ("chat-too-long", ch, {"messages": msg, "max_completion_tokens": model_len}, 400, None),
        ("chat-unknown-model", ch, {"model": "gpt-9", "messages": msg}, 404, "model"),
        ("huge-body", c, {"prompt": "x" * 300_000}, 413, None),
        ("tokenize-neither", "/tokenize", {"model": None}, 400, "prompt"),
        ("detokenize-out-of-vocab", "/detokenize", {"tokens": [10**6]}, 400, "tokens"),
        ("detokenize-strings", "/detokenize", {"tokens": ["a"]}, 400, "tokens.0"),
    ]


ERROR_CASES = _table(MAX_MODEL_LEN)


@pytest.mark.parametrize("case", ERROR_CASES, ids=[c[0] for c in ERROR_CASES])
def test_invalid_requests(server, case):
    _, path, body, status, param = case
    if isinstance(body, bytes):
        response = httpx.post(server.url + path, content=body, headers={"Content-Type": "application/json"})
    else:
        response = httpx.post(server.url + path, json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if param is not None:
        assert error["param"] == param, error
    if "too-long" in case[0]:
        assert error["code"] == "context_length_exceeded" and "context length" in error["message"]


def test_unknown_fields_are_ignored_and_named_in_a_header(server, model_name):
    """As vLLM: a client's extra fields (``metadata``, ``store``, a typo) do not fail the call; the
    answer is the one without them, and X-Aioinfer-Ignored-Fields names what was ignored."""
    c, ch = server.url + "/v1/completions", server.url + "/v1/chat/completions"
    base = {"model": model_name, "prompt": "The sky is", "max_tokens": 4, "temperature": 0}
    plain = httpx.post(c, json=base)
    extra = httpx.post(c, json={**base, "metadata": {"k": "v"}, "max_token": 3})
    assert extra.status_code == 200 and extra.headers["X-Aioinfer-Ignored-Fields"] == "metadata, max_token"
    assert "X-Aioinfer-Ignored-Fields" not in plain.headers
    assert extra.json()["choices"][0]["text"] == plain.json()["choices"][0]["text"]
    messages = [{"role": "user", "content": "hi", "annotations": []}]
    chat = {"model": model_name, "messages": messages, "max_tokens": 4, "temperature": 0, "store": False,
            "reasoning_effort": "low"}
    for stream in (False, True):
        response = httpx.post(ch, json={**chat, "stream": stream})
        assert response.status_code == 200, response.text
        assert response.headers["X-Aioinfer-Ignored-Fields"] == "store, reasoning_effort, messages[0].annotations"


def test_http_errors_and_health_after_bad_requests(server, client, model_name):
    assert len(ERROR_CASES) >= 25
    wrong_method = httpx.get(server.url + "/v1/completions")
    assert wrong_method.status_code == 405 and wrong_method.json()["error"]["code"] == "method_not_allowed"
    missing = httpx.get(server.url + "/v2/nothing")
    assert missing.status_code == 404 and set(missing.json()["error"]) == {"message", "type", "param", "code"}
    assert httpx.get(server.url + "/health").status_code == 200
    assert httpx.get(server.url + "/ready").status_code == 200
    assert client.completions.create(model=model_name, prompt="hi", max_tokens=2).usage.completion_tokens >= 1


# ---------------------------------------------------------------------------- metrics

def test_metrics_parse_and_move(server, client, model_name):
    before = metric_samples(server)
    client.completions.create(model=model_name, prompt=PROMPTS[0], max_tokens=5, temperature=0,
                              extra_body={"ignore_eos": True})
    list(client.completions.create(model=model_name, prompt=PROMPTS[1], max_tokens=5, stream=True))
    httpx.post(server.url + "/v1/completions", json={"prompt": "hi", "top_p": 7})
    after = metric_samples(server)
    assert metric(after, "vllm:request_success_total", finished_reason="length") >= \
        metric(before, "vllm:request_success_total", finished_reason="length") + 1
    assert metric(after, "vllm:generation_tokens_total") >= metric(before, "vllm:generation_tokens_total") + 5
    assert metric(after, "vllm:prompt_tokens_total") > metric(before, "vllm:prompt_tokens_total")
    assert metric(after, "vllm:e2e_request_latency_seconds_count") >= \
        metric(before, "vllm:e2e_request_latency_seconds_count") + 2
    assert metric(after, "vllm:time_to_first_token_seconds_count") > 0
    assert metric(after, "vllm:inter_token_latency_seconds_count") > 0
    assert metric(after, "vllm:request_queue_time_seconds_count") > 0
    assert metric(after, "aioinfer:http_requests_total", status="400") >= 1
    for gauge in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
        # vLLM's labels: the model and the engine (data-parallel replica; "0" alone here)
        assert any(n == gauge and labels == {"model_name": model_name, "engine": "0"} for n, labels, _ in after)
    assert metric(after, "vllm:kv_cache_usage_perc") == 0.0  # idle: every block free again
