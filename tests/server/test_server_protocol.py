"""Unit tests of the server's pure parts: settings, request parsing, SamplingParams conversion, fan-out."""

from __future__ import annotations

import argparse
import asyncio

import pytest

from aioinfer.engine.delta import GenerationDelta
from aioinfer.entrypoints.openai.errors import APIError, from_engine_error
from aioinfer.entrypoints.openai.fanout import ChoiceSpec, ChoiceStreams
from aioinfer.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
from aioinfer.entrypoints.openai.sampling import chat_params, choice_params, completion_params
from aioinfer.entrypoints.openai.serving_common import parse_body
from aioinfer.entrypoints.serve_cli import add_serve_parser, config_from_args
from aioinfer.errors import EngineDeadError, EngineOverloaded
from aioinfer.sampling_params import SamplingParams
from aioinfer.server_config import ServerConfig


def test_config_from_env_types_and_errors():
    config = ServerConfig.from_env({"AIOINFER_MODEL": "/m", "AIOINFER_MAX_MODEL_LEN": "2048", "AIOINFER_DTYPE": "float32",
                                    "AIOINFER_STALL_TIMEOUT": "2.5", "AIOINFER_LOG_REQUESTS": "off",
                                    "AIOINFER_API_KEY": "", "AIOINFER_FAULT_INJECT_STEP": "3"})
    assert config.model == "/m" and config.api_key is None and config.log_requests is False
    assert config.engine_arguments() == {"model": "/m", "max_model_len": 2048, "dtype": "float32",
                                         "stall_timeout": 2.5, "fault_inject_step": 3}
    with pytest.raises(ValueError, match="AIOINFER_MAX_NUM_SEQS must be int"):
        ServerConfig.from_env({"AIOINFER_MAX_NUM_SEQS": "many"})
    with pytest.raises(ValueError, match="max_body_bytes"):
        ServerConfig.from_env({"AIOINFER_MAX_BODY_BYTES": "0"})


def test_cli_flags_override_env():
    parser = argparse.ArgumentParser()
    add_serve_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["serve", "--max-model-len", "128", "--api-key", "k", "--served-model-name", "x",
                              "--disable-log-requests"])
    config = config_from_args(args, {"AIOINFER_MAX_MODEL_LEN": "64", "AIOINFER_MAX_NUM_SEQS": "4", "AIOINFER_MODEL": "m"})
    assert config.engine_kwargs == {"max_model_len": 128, "max_num_seqs": 4}
    assert (config.model, config.api_key, config.served_model_name, config.log_requests) == ("m", "k", "x", False)


def test_completion_request_to_params():
    req = parse_body(CompletionRequest, b'{"prompt": "hi", "temperature": 0.5, "top_k": 3, "seed": 7, '
                                        b'"logit_bias": {"5": -100}, "stop": "\\n", "logprobs": 2}')
    params = completion_params(req, {"temperature": 0.1, "top_p": 0.8})
    assert (params.temperature, params.top_p, params.top_k, params.max_tokens) == (0.5, 0.8, 3, 16)
    assert params.logit_bias == {5: -100.0} and params.stop == ["\n"] and params.logprobs == 2
    assert [choice_params(params, i).seed for i in range(3)] == [7, 8, 9]
    assert choice_params(SamplingParams(), 2).seed is None


def test_chat_request_to_params():
    req = parse_body(ChatCompletionRequest, b'{"messages": [{"role": "user", "content": [{"type": "text", '
                                            b'"text": "a"}, {"type": "text", "text": "b"}]}], "logprobs": true}')
    params = chat_params(req)
    assert params.max_tokens is None and params.logprobs == 0 and params.temperature == 1.0
    assert req.messages[0].for_template() == {"role": "user", "content": "a\nb"}
    with_max = chat_params(parse_body(ChatCompletionRequest, b'{"messages": [{"role": "user", "content": "x"}], '
                                                             b'"max_completion_tokens": 5, "top_logprobs": 3, '
                                                             b'"logprobs": true}'))
    assert (with_max.max_tokens, with_max.logprobs) == (5, 3)


@pytest.mark.parametrize("body, param", [
    (b'{"prompt": "x", "max_tokens": true}', "max_tokens"),
    (b'{"prompt": [[1], []]}', "prompt"),
    (b'{"prompt": "x", "bad_words": ["no"]}', "bad_words"),  # would change the result: refused, not ignored
    (b'{"prompt": "x", "stream_options": {"include_usage": 1}}', "stream_options.include_usage"),
])
def test_parse_errors_name_the_field(body, param):
    with pytest.raises(APIError) as info:
        parse_body(CompletionRequest, body)
    assert info.value.status == 400 and info.value.param == param


def test_engine_errors_map_to_statuses():
    assert from_engine_error(EngineOverloaded("full", retry_after=0.2)).status == 429
    assert from_engine_error(EngineOverloaded("full", retry_after=0.2)).retry_after >= 1
    assert from_engine_error(EngineDeadError("x")).status == 503
    assert from_engine_error(ValueError("bad")).status == 400
    assert from_engine_error(RuntimeError("boom")).status == 500


class _FakeEngine:
    """generate() admits at once and returns a not-yet-started async generator, like the real Engine."""

    def __init__(self, fail_at: int = -1) -> None:
        self.open: set[str] = set()
        self.calls = 0
        self.fail_at = fail_at

    def generate(self, prompt, params, *, request_id, priority=0):
        if self.calls == self.fail_at:
            raise EngineOverloaded("full")
        self.calls += 1
        self.open.add(request_id)
        return self._stream(request_id)

    async def _stream(self, request_id):
        try:
            for i in range(3):
                await asyncio.sleep(0)
                yield GenerationDelta(request_id, [i], str(i), None, finish_reason="length" if i == 2 else None)
        finally:
            self.open.discard(request_id)

    async def abort(self, request_id):
        self.open.discard(request_id)


def _specs(n):
    return [ChoiceSpec(index=i, prompt_index=0, prompt=[1], params=SamplingParams()) for i in range(n)]


def test_fanout_merges_and_cleans_up():
    async def main():
        engine = _FakeEngine()
        streams = ChoiceStreams.admit(engine, _specs(3), "r", 0)
        texts = {}
        async for spec, delta in streams.merged():
            texts[spec.index] = texts.get(spec.index, "") + delta.text
        assert texts == {0: "012", 1: "012", 2: "012"} and not engine.open

        # Leaving early (client disconnect) aborts everything.
        streams = ChoiceStreams.admit(engine, _specs(2), "s", 0)
        merged = streams.merged()
        await merged.__anext__()
        await merged.aclose()
        assert not engine.open

        # A body that never started: close() alone releases the admitted requests.
        streams = ChoiceStreams.admit(engine, _specs(2), "t", 0)
        await streams.close()
        assert not engine.open

        # Admission failing halfway aborts the choices already admitted.
        failing = _FakeEngine(fail_at=1)
        with pytest.raises(EngineOverloaded):
            ChoiceStreams.admit(failing, _specs(3), "u", 0)
        await asyncio.sleep(0)
        assert not failing.open

    asyncio.run(main())
