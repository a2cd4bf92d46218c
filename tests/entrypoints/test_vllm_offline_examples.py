"""vLLM's offline examples, as their users run them with the import changed (``vllm`` -> ``aioinfer``):
each test makes the calls of one example (examples/offline_inference/: basic/basic.py,
basic/generate.py, basic/chat.py, prefix_caching.py, basic_with_model_default_sampling, async
streaming through ``AsyncLLM``, and the token-id prompts of llm_engine_example.py), on a tiny model
so that they run in seconds. vLLM's code itself is not here: only the API shape its examples use.
"""

from __future__ import annotations

import asyncio

import pytest
from tiny_models import make_tiny_model_dir

from aioinfer import LLM, AsyncEngineArgs, AsyncLLM, EngineArgs, SamplingParams
from aioinfer.distributed.parallel_state import cleanup_dist_env_and_memory
from aioinfer.inputs import TextPrompt, TokensPrompt
from aioinfer.sampling_params import RequestOutputKind
from aioinfer.utils.argparse_utils import FlexibleArgumentParser

PROMPTS = ["Hello, my name is", "The president of the United States is", "The capital of France is",
           "The future of AI is"]
CPU = {"device": "cpu", "dtype": "float32"}  # what the examples leave to the machine, pinned for the test


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return str(make_tiny_model_dir(tmp_path_factory.mktemp("examples"), arch="qwen2"))


def test_basic(model):
    sampling_params = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=8)
    llm = LLM(model=model, **CPU)
    outputs = llm.generate(PROMPTS, sampling_params)
    assert [output.prompt for output in outputs] == PROMPTS
    for output in outputs:
        generated_text = output.outputs[0].text
        assert isinstance(generated_text, str) and 1 <= len(output.outputs[0].token_ids) <= 8


def _create_parser(model: str) -> FlexibleArgumentParser:
    parser = FlexibleArgumentParser()
    EngineArgs.add_cli_args(parser)
    parser.set_defaults(model=model)
    sampling_group = parser.add_argument_group("Sampling parameters")
    sampling_group.add_argument("--max-tokens", type=int)
    sampling_group.add_argument("--temperature", type=float)
    sampling_group.add_argument("--top-p", type=float)
    sampling_group.add_argument("--top-k", type=int)
    return parser


def test_generate_with_the_engine_argument_parser(model):
    parser = _create_parser(model)
    args: dict = vars(parser.parse_args(["--max_model_len=256", "--max-num-seqs", "8", "--device", "cpu",
                                         "--dtype", "float32", "--no-enable-prefix-caching", "--max-tokens", "6",
                                         "--temperature", "0"]))
    # Flags not given stay out, so the engine's defaults hold (vLLM's parser fills every one in).
    assert set(args) == {"model", "max_model_len", "max_num_seqs", "device", "dtype", "enable_prefix_caching",
                         "max_tokens", "temperature", "top_p", "top_k"}
    max_tokens, temperature = args.pop("max_tokens"), args.pop("temperature")
    top_p, top_k = args.pop("top_p"), args.pop("top_k")
    llm = LLM(**args)
    assert llm.config.model.max_model_len == 256 and llm.config.scheduler.max_num_seqs == 8
    assert not llm.config.cache.enable_prefix_caching
    sampling_params = llm.get_default_sampling_params()
    if max_tokens is not None:
        sampling_params.max_tokens = max_tokens
    if temperature is not None:
        sampling_params.temperature = temperature
    if top_p is not None:
        sampling_params.top_p = top_p
    if top_k is not None:
        sampling_params.top_k = top_k
    outputs = llm.generate(PROMPTS, sampling_params)
    assert all(1 <= len(o.outputs[0].token_ids) <= 6 for o in outputs)
    assert EngineArgs.from_cli_args(parser.parse_args(["-tp", "1"])).kwargs() == {"model": model,
                                                                                  "tensor_parallel_size": 1}


def test_chat(model):
    llm = LLM(model=model, **CPU)
    sampling_params = llm.get_default_sampling_params()
    sampling_params.max_tokens = 6
    conversation = [{"role": "system", "content": "You are a helpful assistant"},
                    {"role": "user", "content": "Hello"},
                    {"role": "assistant", "content": "Hello! How can I assist you today?"},
                    {"role": "user", "content": "Write an essay about the importance of higher education."}]
    outputs = llm.chat(conversation, sampling_params, use_tqdm=False)
    assert len(outputs) == 1 and outputs[0].prompt.endswith("<|im_start|>assistant\n")
    outputs = llm.chat([conversation for _ in range(3)], sampling_params, use_tqdm=False)  # a batch
    assert len(outputs) == 3
    template = ("{% for message in messages %}{{ message['role'] + ': ' + message['content'] + '\\n' }}{% endfor %}"
                "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}")
    outputs = llm.chat(conversation, sampling_params, use_tqdm=False, chat_template=template)
    assert outputs[0].prompt.startswith("system: You are a helpful assistant\n")


def test_prefix_caching(model):
    prefix = "You are an expert school principal, skilled in effectively managing faculty and staff. " * 3
    generating_prompts = [prefix + prompt for prompt in PROMPTS]
    sampling_params = SamplingParams(temperature=0.0, max_tokens=8)
    regular_llm = LLM(model=model, enable_prefix_caching=False, gpu_memory_utilization=0.4, **CPU)
    outputs = regular_llm.generate(generating_prompts, sampling_params)
    regular_generated_texts = [output.outputs[0].text for output in outputs]
    del regular_llm
    cleanup_dist_env_and_memory()

    prefix_cached_llm = LLM(model=model, enable_prefix_caching=True, gpu_memory_utilization=0.4, **CPU)
    prefix_cached_llm.generate(generating_prompts[0], sampling_params)  # warm-up: fills the cache
    outputs = prefix_cached_llm.generate(generating_prompts, sampling_params)
    cached_generated_texts = [output.outputs[0].text for output in outputs]
    assert cached_generated_texts == regular_generated_texts
    assert all(output.num_cached_tokens > 0 for output in outputs)


def test_basic_with_model_default_sampling(model):
    llm = LLM(model=model, generation_config="auto", **CPU)
    sampling_params = llm.get_default_sampling_params()
    # The folder's generation_config.json (tests/tiny_models.py): temperature 0.7, top_p 0.8, top_k 20.
    assert (sampling_params.temperature, sampling_params.top_p, sampling_params.top_k) == (0.7, 0.8, 20)
    sampling_params.max_tokens = 6
    outputs = llm.generate(PROMPTS, sampling_params)
    assert len(outputs) == len(PROMPTS)
    vllm_defaults = LLM(model=model, generation_config="vllm", **CPU).get_default_sampling_params()
    assert (vllm_defaults.temperature, vllm_defaults.top_p, vllm_defaults.top_k) == (1.0, 1.0, 0)


def test_token_id_and_text_prompts(model):
    """llm_engine_example.py's prompts: token ids and text, as TokensPrompt / TextPrompt or plain dicts."""
    llm = LLM(model=model, **CPU)
    tokenizer = llm.get_tokenizer()
    ids = tokenizer.encode(PROMPTS[2])
    greedy = SamplingParams(temperature=0.0, max_tokens=6)
    by_text = llm.generate(PROMPTS[2], greedy, use_tqdm=False)[0].outputs[0].token_ids
    prompts = [TokensPrompt(prompt_token_ids=ids), {"prompt_token_ids": ids}, TextPrompt(prompt=PROMPTS[2]),
               {"prompt": PROMPTS[2]}]
    outputs = llm.generate(prompts, greedy, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == [by_text] * 4
    assert outputs[0].prompt_token_ids == ids


def test_async_streaming(model):
    """examples/offline_inference/async_llm_streaming.py's calls: DELTA outputs, then shutdown."""
    async def stream_response(engine: AsyncLLM, prompt: str, request_id: str) -> tuple[str, int]:
        sampling_params = SamplingParams(max_tokens=8, temperature=0.0, output_kind=RequestOutputKind.DELTA)
        text, deltas = "", 0
        async for output in engine.generate(request_id=request_id, prompt=prompt, sampling_params=sampling_params):
            for completion in output.outputs:
                text += completion.text
            deltas += 1
            if output.finished:
                break
        return text, deltas

    async def main() -> list:
        engine_args = AsyncEngineArgs(model=model, enforce_eager=True, **CPU)
        engine = AsyncLLM.from_engine_args(engine_args)
        try:
            streamed = [await stream_response(engine, prompt, f"stream-{i}") for i, prompt in enumerate(PROMPTS[:2])]
        finally:
            engine.shutdown()
        return streamed

    streamed = asyncio.run(main())
    offline = LLM(model=model, **CPU).generate(PROMPTS[:2], SamplingParams(max_tokens=8, temperature=0.0),
                                               use_tqdm=False)
    assert [text for text, _ in streamed] == [o.outputs[0].text for o in offline]
    assert all(deltas > 1 for _, deltas in streamed)
