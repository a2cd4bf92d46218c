"""stream_interval: several tokens per streamed delta (the first and the last at once), the same
tokens and text as every-token streaming, in the engine and through the real server."""

from __future__ import annotations

import json

import anyio
import httpx
import pytest

from aioinfer import LLM, Engine, SamplingParams
from server_process import run_server
from tiny_models import make_tiny_model_dir

OPTIONS = dict(dtype="float32", device="cpu", max_model_len=256, num_kv_blocks=64)
PARAMS = SamplingParams(temperature=0, max_tokens=23, ignore_eos=True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(make_tiny_model_dir(tmp_path_factory.mktemp("qwen2"), arch="qwen2"))


@pytest.fixture(scope="module")
def offline(model_dir):
    return LLM(model=model_dir, **OPTIONS).generate(["Hello world, this is"], PARAMS, use_tqdm=False)[0].outputs[0]


def test_engine_holds_deltas_to_the_interval(model_dir, offline):
    async def main():
        async with Engine(model_dir, **OPTIONS, stream_interval=4) as engine:
            return [d async for d in engine.generate("Hello world, this is", PARAMS)]

    deltas = anyio.run(main)
    sizes = [len(d.token_ids) for d in deltas]
    assert sizes[0] == 1  # the first token is not held
    assert all(size >= 4 for size in sizes[1:-1]) and sum(sizes) == 23, sizes
    assert [t for d in deltas for t in d.token_ids] == offline.token_ids
    assert "".join(d.text for d in deltas) == offline.text and deltas[-1].finish_reason == "length"


def test_server_streams_several_tokens_per_chunk(model_dir, offline, tmp_path):
    env = {"AIOINFER_MODEL": model_dir, "AIOINFER_DEVICE": "cpu", "AIOINFER_DTYPE": "float32",
           "AIOINFER_MAX_MODEL_LEN": "256", "AIOINFER_NUM_KV_BLOCKS": "64", "AIOINFER_STREAM_INTERVAL": "5"}
    body = {"prompt": "Hello world, this is", "max_tokens": 23, "temperature": 0, "ignore_eos": True,
            "logprobs": 0}
    with run_server(env, tmp_path) as server:
        with httpx.stream("POST", server.url + "/v1/completions", json={**body, "stream": True}, timeout=60) as r:
            chunks = [json.loads(line[6:]) for line in r.iter_lines()
                      if line.startswith("data: ") and line != "data: [DONE]"]
        full = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()
    tokens_per_chunk = [len(c["choices"][0]["logprobs"]["tokens"]) for c in chunks]
    assert tokens_per_chunk[0] == 1 and sum(tokens_per_chunk) == 23
    assert all(n >= 5 for n in tokens_per_chunk[1:-1]), tokens_per_chunk
    streamed = "".join(c["choices"][0]["text"] for c in chunks)
    assert streamed == full["choices"][0]["text"] == offline.text
