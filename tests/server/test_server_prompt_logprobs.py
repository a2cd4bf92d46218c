"""vLLM's extras on the server, through the official ``openai`` client: ``prompt_logprobs``, completions'
``echo`` with ``logprobs``, ``return_token_ids`` (streamed and not), chat ``top_logprobs: -1``.

One server process on a tiny random Qwen2 model; values are compared with the offline ``LLM``."""

from __future__ import annotations

import httpx
import pytest
from openai import OpenAI

from aioinfer import LLM, SamplingParams
from server_process import start_server
from tiny_models import VOCAB_SIZE, make_tiny_model_dir

ENGINE_OPTIONS = dict(dtype="float32", device="cpu", max_model_len=256, block_size=16, num_kv_blocks=128,
                      cpu_threads=1)  # as the server runs (server_process.py): the same sums, the same logprobs
PROMPTS = ["Hello, world! How are you", "The quick brown fox"]
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Who won in 2020?"}]
GREEDY = dict(temperature=0, max_tokens=5)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(make_tiny_model_dir(tmp_path_factory.mktemp("qwen2"), arch="qwen2"))


@pytest.fixture(scope="module")
def server(model_dir):
    env = {"AIOINFER_" + k.upper(): str(v) for k, v in ENGINE_OPTIONS.items()}
    proc = start_server({**env, "AIOINFER_MODEL": model_dir})
    yield proc
    assert proc.stop() == 0, proc.output()
    proc.close_log()


@pytest.fixture(scope="module")
def llm(model_dir):
    return LLM(model=model_dir, **ENGINE_OPTIONS)


@pytest.fixture(scope="module")
def client(server):
    return OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def model(client):
    return client.models.list().data[0].id


def as_json(entries) -> list:
    """The offline RequestOutput.prompt_logprobs as vLLM's server writes them."""
    return [None if e is None else {str(t): {"logprob": lp.logprob, "rank": lp.rank, "decoded_token": lp.decoded_token}
                                    for t, lp in e.items()} for e in entries]


def test_completion_prompt_logprobs_equal_offline(client, model, llm):
    want = llm.generate(PROMPTS, SamplingParams(prompt_logprobs=2, **GREEDY), use_tqdm=False)
    got = client.completions.create(model=model, prompt=PROMPTS, extra_body={"prompt_logprobs": 2}, **GREEDY)
    for choice, expected in zip(got.choices, want):
        assert choice.prompt_logprobs == as_json(expected.prompt_logprobs)
        assert choice.text == expected.outputs[0].text
    plain = client.completions.create(model=model, prompt=PROMPTS[0], **GREEDY).choices[0]
    assert plain.model_extra.get("prompt_logprobs") is None


@pytest.mark.parametrize("top", [0, 1, 3])
def test_echo_with_logprobs_covers_the_prompt(client, model, llm, top):
    ids = llm.get_tokenizer().encode(PROMPTS[0])
    want = llm.generate([PROMPTS[0]], SamplingParams(prompt_logprobs=top, logprobs=top, **GREEDY), use_tqdm=False)[0]
    sampled = want.outputs[0]
    all_ids = ids + sampled.token_ids
    for prompt in (PROMPTS[0], ids):
        got = client.completions.create(model=model, prompt=prompt, echo=True, logprobs=top, **GREEDY).choices[0]
        lp = got.logprobs
        assert got.text.startswith(llm.get_tokenizer().decode(ids)) and got.text.endswith(sampled.text)
        assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.text_offset) == len(all_ids)
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
        assert lp.token_logprobs[1:] == [e[t].logprob for e, t in zip(want.prompt_logprobs[1:] + sampled.logprobs,
                                                                       all_ids[1:])]
        assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
        assert lp.tokens[0] == llm.get_tokenizer().decode(ids[:1])
        assert got.model_extra["prompt_logprobs"] == as_json(want.prompt_logprobs)
        streamed = [c.choices[0].logprobs for c in client.completions.create(
            model=model, prompt=prompt, echo=True, logprobs=top, stream=True, **GREEDY)]
        assert [v for part in streamed for v in part.token_logprobs] == lp.token_logprobs
        assert [t for part in streamed for t in part.tokens] == lp.tokens
    # Named by id, no two tokens share a key: each position has the top-N and the token itself.
    named = client.completions.create(model=model, prompt=PROMPTS[0], echo=True, logprobs=top,
                                      extra_body={"return_tokens_as_token_ids": True}, **GREEDY).choices[0].logprobs
    assert named.tokens == [f"token_id:{t}" for t in all_ids]
    assert all(max(top, 1) <= len(t) <= top + 1 for t in named.top_logprobs[1:])


def test_completion_return_token_ids(client, model, llm):
    ids = llm.get_tokenizer().encode(PROMPTS[1])
    want = llm.generate([PROMPTS[1]], SamplingParams(**GREEDY), use_tqdm=False)[0].outputs[0]
    got = client.completions.create(model=model, prompt=PROMPTS[1], extra_body={"return_token_ids": True}, **GREEDY)
    assert got.choices[0].prompt_token_ids == ids and got.choices[0].token_ids == want.token_ids
    off = client.completions.create(model=model, prompt=PROMPTS[1], extra_body={"return_token_ids": False}, **GREEDY)
    assert off.choices[0].model_extra.get("token_ids") is None
    assert off.choices[0].model_extra.get("prompt_token_ids") is None
    # Streamed, with the logprobs' tokens named by id (vLLM's test): each chunk's ids are its tokens'.
    chunks = list(client.completions.create(
        model=model, prompt=PROMPTS[1], logprobs=1, stream=True,
        extra_body={"return_token_ids": True, "return_tokens_as_token_ids": True}, **GREEDY))
    assert chunks[0].choices[0].prompt_token_ids == ids
    assert all(c.choices[0].model_extra.get("prompt_token_ids") is None for c in chunks[1:])
    streamed = [t for c in chunks for t in c.choices[0].token_ids]
    named = [int(token.split(":")[1]) for c in chunks for token in c.choices[0].logprobs.tokens]
    assert streamed == named == want.token_ids


def test_chat_prompt_logprobs_and_return_token_ids(client, model, llm):
    want = llm.chat(MESSAGES, SamplingParams(prompt_logprobs=1, **GREEDY), use_tqdm=False)[0]
    got = client.chat.completions.create(model=model, messages=MESSAGES,
                                         extra_body={"prompt_logprobs": 1, "return_token_ids": True}, **GREEDY)
    assert got.prompt_logprobs == as_json(want.prompt_logprobs)
    assert len(got.prompt_logprobs) == got.usage.prompt_tokens
    assert got.prompt_token_ids == want.prompt_token_ids and got.choices[0].token_ids == want.outputs[0].token_ids
    plain = client.chat.completions.create(model=model, messages=MESSAGES, **GREEDY)
    assert plain.model_extra.get("prompt_logprobs") is None and plain.model_extra.get("prompt_token_ids") is None
    chunks = list(client.chat.completions.create(model=model, messages=MESSAGES, stream=True,
                                                 extra_body={"return_token_ids": True}, **GREEDY))
    assert chunks[0].prompt_token_ids == want.prompt_token_ids
    assert all("prompt_token_ids" not in c.model_dump() for c in chunks[1:])
    streamed = [t for c in chunks if c.choices for t in (c.choices[0].model_extra.get("token_ids") or [])]
    assert streamed == want.outputs[0].token_ids
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want.outputs[0].text


@pytest.fixture(scope="module")
def whole_vocab_server(model_dir):
    """vLLM's chat test of top_logprobs -1 runs its server with --max-logprobs raised: -1 here."""
    env = {"AIOINFER_" + k.upper(): str(v) for k, v in ENGINE_OPTIONS.items()}
    proc = start_server({**env, "AIOINFER_MODEL": model_dir, "AIOINFER_MAX_LOGPROBS": "-1"})
    yield proc
    assert proc.stop() == 0, proc.output()
    proc.close_log()


def test_chat_top_logprobs_minus_one_is_the_whole_vocabulary(whole_vocab_server, model):
    client = OpenAI(base_url=whole_vocab_server.base_url, api_key="unused", max_retries=0)
    # vLLM's test, as it sends it: "logprobs" as the string "true".
    got = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=1,
                                         extra_body={"top_logprobs": -1, "logprobs": "true"})
    content = got.choices[0].logprobs.content
    assert len(content) == 1 and len(content[0].top_logprobs) == VOCAB_SIZE
    values = [t.logprob for t in content[0].top_logprobs]
    # the chosen token first (vLLM's order), then the rest of the vocabulary, most likely first
    assert content[0].top_logprobs[0].token == content[0].token and values[0] == content[0].logprob
    assert values[1:] == sorted(values[1:], reverse=True)
    everything = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=1,
                                                extra_body={"prompt_logprobs": -1})
    assert all(len(entry) == VOCAB_SIZE for entry in everything.prompt_logprobs[1:])
    # The whole vocabulary for every token up to the end of the context: over the bound, refused.
    over = httpx.post(whole_vocab_server.url + "/v1/chat/completions",
                      json={"messages": MESSAGES, "logprobs": True, "top_logprobs": -1})
    assert over.status_code == 400, over.text


@pytest.mark.parametrize("path, body, param", [
    ("/v1/completions", {"prompt": "hi", "prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
    ("/v1/completions", {"prompt": "hi", "prompt_logprobs": 21}, "prompt_logprobs"),
    ("/v1/completions", {"prompt": "hi", "prompt_logprobs": -2}, "prompt_logprobs"),
    ("/v1/completions", {"prompt": "hi", "logprobs": -1}, "logprobs"),
    ("/v1/chat/completions", {"messages": MESSAGES, "prompt_logprobs": 2, "stream": True}, "prompt_logprobs"),
    ("/v1/chat/completions", {"messages": MESSAGES, "logprobs": True, "top_logprobs": -2}, "top_logprobs"),
    ("/v1/chat/completions", {"messages": MESSAGES, "logprobs": "yes"}, "logprobs"),
    # Over the engine's max_logprobs (20 unless --max-logprobs says more), -1 the whole vocabulary: vLLM's 400s.
    ("/v1/chat/completions", {"messages": MESSAGES, "logprobs": True, "top_logprobs": -1, "max_tokens": 1},
     "top_logprobs"),
    ("/v1/chat/completions", {"messages": MESSAGES, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("/v1/completions", {"prompt": "hi", "prompt_logprobs": -1, "max_tokens": 1}, "prompt_logprobs"),
    ("/v1/completions", {"prompt": "hi", "logprobs": 21}, "logprobs"),
])
def test_refused(server, path, body, param):
    response = httpx.post(server.url + path, json=body)
    assert response.status_code == 400, response.text
    if param is not None:
        assert response.json()["error"]["param"] == param
