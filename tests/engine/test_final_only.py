"""Non-streaming delivery (``generate(..., stream=False)``, vLLM's FINAL_ONLY) on a real tiny model:
one delta equal to the merge of the streamed ones (greedy, stop strings, logprobs, EOS), the consumer
not woken before the end, aborts / deadlines / cancellation, request stats, the data-parallel engine,
the OpenAI routes' use of it, and the linear-time merger against ``GenerationDelta.merge``."""

from __future__ import annotations

import anyio
import pytest

from aioinfer import DataParallelEngine, Engine, SamplingParams
from aioinfer.engine.delta import DeltaMerger, GenerationDelta
from aioinfer.errors import RequestDeadlineExceeded
from aioinfer.outputs import Logprob
from tiny_models import make_tiny_model_dir

PROMPTS = [[5, 9, 13, 200, 7], [42] * 3, list(range(30, 70)), "Hello world", "今天天气很好 🎉"]
OPTIONS = dict(dtype="float32", device="cpu", max_num_batched_tokens=64)
LONG = SamplingParams(temperature=0, max_tokens=300, ignore_eos=True)


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request):
    return request.param


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(make_tiny_model_dir(tmp_path_factory.mktemp("qwen2"), arch="qwen2"))


class Recorder:
    """Keeps every RequestStats by request id."""

    def __init__(self) -> None:
        self.done = {}

    def on_step(self, stats) -> None:
        pass

    def on_request_done(self, stats) -> None:
        self.done[stats.request_id] = stats

    def on_rejected(self, reason) -> None:
        pass


async def deltas_of(stream) -> list[GenerationDelta]:
    return [delta async for delta in stream]


def merged(deltas: list[GenerationDelta]) -> dict:
    """What a consumer of the streamed deltas ends up with, field by field."""
    logprobs = [entry for d in deltas if d.logprobs is not None for entry in d.logprobs]
    last = deltas[-1]
    return dict(token_ids=[t for d in deltas for t in d.token_ids], text="".join(d.text for d in deltas),
                logprobs=logprobs if any(d.logprobs is not None for d in deltas) else None,
                finish_reason=last.finish_reason, stop_reason=last.stop_reason,
                num_prompt_tokens=deltas[0].num_prompt_tokens, num_output_tokens=last.num_output_tokens,
                num_cached_tokens=last.num_cached_tokens, prompt_token_ids=deltas[0].prompt_token_ids)


def same_logprobs(a, b) -> bool:
    """Equal ids, ranks and decoded tokens; values equal up to float noise (the two copies of a request
    may run in differently composed batches)."""
    if a is None or b is None:
        return a is b
    shape = [[(tid, lp.rank, lp.decoded_token) for tid, lp in entry.items()] for entry in a]
    return (shape == [[(tid, lp.rank, lp.decoded_token) for tid, lp in entry.items()] for entry in b]
            and [lp.logprob for e in a for lp in e.values()] == pytest.approx([lp.logprob for e in b for lp in e.values()],
                                                                               abs=1e-4))


def fields(delta: GenerationDelta) -> dict:
    return {key: getattr(delta, key) for key in merged([delta])}


async def wait_until(predicate, timeout: float = 10) -> None:
    with anyio.fail_after(timeout):
        while not predicate():
            await anyio.sleep(0.01)


def idle(engine) -> bool:
    return engine._core.kv_cache.all_free() and not engine._core.has_unfinished()


async def param_sets(engine) -> list[SamplingParams]:
    """Greedy with and without EOS, logprobs, and stop strings cut from the greedy text."""
    text = "".join(d.text for d in await deltas_of(engine.generate(PROMPTS[3], SamplingParams(
        temperature=0, max_tokens=16, ignore_eos=True))))
    assert len(text) >= 8, text  # the tiny model's greedy text is long enough to cut stop strings from
    return [
        SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=40),  # may end on EOS
        SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, logprobs=2),
        SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, stop=[text[4:6]], logprobs=1),
        SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, stop=[text[5:8]],
                       include_stop_str_in_output=True),
        SamplingParams(temperature=0.8, top_p=0.9, seed=7, max_tokens=12, ignore_eos=True),
    ]


@pytest.mark.anyio
async def test_final_only_equals_merged_stream(model_dir):
    results = {}
    # No prefix cache: the second copy of a prompt would count cached tokens the first did not.
    async with Engine(model_dir, **OPTIONS, enable_prefix_caching=False) as engine:
        params_list = await param_sets(engine)

        async def run(mode, p, i):
            results[mode, p, i] = await deltas_of(engine.generate(PROMPTS[i], params_list[p], stream=mode == "stream"))

        async with anyio.create_task_group() as tg:  # both modes in the same batches
            for p in range(len(params_list)):
                for i in range(len(PROMPTS)):
                    for mode in ("stream", "final"):
                        tg.start_soon(run, mode, p, i)
        await wait_until(lambda: idle(engine))
    stopped = 0
    for p in range(len(params_list)):
        for i in range(len(PROMPTS)):
            streamed, final = results["stream", p, i], results["final", p, i]
            assert len(final) == 1, (p, i, len(final))
            got, want = fields(final[0]), merged(streamed)
            assert same_logprobs(got.pop("logprobs"), want.pop("logprobs")), (p, i)
            assert got == want, (p, i)
            stopped += final[0].stop_reason in params_list[p].stop
            if params_list[p].logprobs is not None:
                assert len(final[0].logprobs) == len(final[0].token_ids)
                assert all(isinstance(lp, Logprob) for entry in final[0].logprobs for lp in entry.values())
    assert stopped >= 1  # at least one stop string really cut a request
    assert any(len(results["stream", 0, i]) > 1 for i in range(len(PROMPTS)))


@pytest.mark.anyio
async def test_a_slow_streaming_consumer_catches_up_with_the_same_result(model_dir):
    """Buffer of 3: the reader, late, takes 3 buffered deltas merged, then the merged overflow."""
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, logprobs=1)
    async with Engine(model_dir, **OPTIONS, stream_buffer_size=3, enable_prefix_caching=False) as engine:
        final = await deltas_of(engine.generate(PROMPTS[3], params, stream=False))
        stream = engine.generate(PROMPTS[3], params, request_id="late")
        await wait_until(lambda: "late" not in engine._channels)  # finished before anything was read
        late = await deltas_of(stream)
    assert len(late) == 2 and [len(d.token_ids) for d in late] == [3, 17]
    got, want = fields(final[0]), merged(late)
    assert same_logprobs(got.pop("logprobs"), want.pop("logprobs")) and got == want


@pytest.mark.anyio
async def test_consumer_sleeps_until_the_end_and_stats_still_count(model_dir):
    recorder = Recorder()
    async with Engine(model_dir, **OPTIONS, observers=[recorder]) as engine:
        stream = engine.generate(PROMPTS[0], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True),
                                 request_id="final", stream=False)
        got = []

        async def consume():
            got.extend(await deltas_of(stream))

        async with anyio.create_task_group() as tg:
            tg.start_soon(consume)
            channel = engine._channels["final"]
            await wait_until(lambda: channel.waiter is not None and channel.num_output_tokens >= 3)
            waiter = channel.waiter  # the consumer's one wait: a wake-up would have replaced it
            await wait_until(lambda: channel.num_output_tokens >= 10)
            assert channel.waiter is waiter and channel.queued == 0 and not got
        assert len(got) == 1 and len(got[0].token_ids) == 30 and got[0].finish_reason == "length"
    stats = recorder.done["final"]
    assert stats.status == "finished" and stats.num_output_tokens == 30 and stats.ttft is not None
    assert len(stats.inter_token_latencies) == 29  # one token per step after the first


@pytest.mark.anyio
async def test_abort_deadline_and_cancellation_with_stream_false(model_dir):
    recorder = Recorder()
    async with Engine(model_dir, **OPTIONS, max_num_seqs=2, observers=[recorder]) as engine:
        reference = await deltas_of(engine.generate(PROMPTS[2], LONG))
        want = merged(reference)["token_ids"]

        # abort by id: one delta, the tokens so far (a prefix of the full output), "abort"
        stream = engine.generate(PROMPTS[2], LONG, request_id="aborted", stream=False)
        channel = engine._channels["aborted"]
        await wait_until(lambda: channel.num_output_tokens >= 5)
        await engine.abort("aborted")
        (final,) = await deltas_of(stream)
        assert final.finish_reason == "abort" and len(final.token_ids) == final.num_output_tokens >= 5
        assert final.token_ids == want[:len(final.token_ids)]
        await wait_until(lambda: idle(engine))

        # a deadline that passes while the consumer waits for its one delta
        stream = engine.generate(PROMPTS[2], LONG, request_id="late", stream=False,
                                 deadline=anyio.current_time() + 0.2)
        with pytest.raises(RequestDeadlineExceeded):
            await deltas_of(stream)
        await wait_until(lambda: idle(engine))

        # the consuming task is cancelled (a client that disconnects)
        with anyio.move_on_after(0.2) as scope:
            await deltas_of(engine.generate(PROMPTS[2], LONG, request_id="left", stream=False))
        assert scope.cancelled_caught
        await wait_until(lambda: idle(engine))
        assert engine.stats()["open_requests"] == 0
    assert [recorder.done[r].abort_cause for r in ("aborted", "late", "left")] == ["api", "deadline", "client"]
    assert all(recorder.done[r].status == "aborted" for r in ("aborted", "late", "left"))


@pytest.mark.anyio
async def test_data_parallel_stream_false(model_dir):
    results = {}
    greedy = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    async with DataParallelEngine(model_dir, data_parallel_size=2, block_size=4, enable_prefix_caching=False,
                                  **OPTIONS) as engine:
        async def run(mode, i):
            results[mode, i] = await deltas_of(engine.generate(PROMPTS[i], greedy, request_id=f"{mode}-{i}",
                                                               stream=mode == "stream"))

        async with anyio.create_task_group() as tg:
            for i in range(len(PROMPTS)):
                for mode in ("stream", "final"):
                    tg.start_soon(run, mode, i)
        for i in range(len(PROMPTS)):
            assert len(results["final", i]) == 1 and fields(results["final", i][0]) == merged(results["stream", i])
        assert all(s["routed"] > 0 for s in engine.stats()["replicas"])

        stream = engine.generate(PROMPTS[2], LONG, request_id="dp-aborted", stream=False)
        replica = engine.replicas[engine._open["dp-aborted"].replica]
        await wait_until(lambda: replica._channels["dp-aborted"].num_output_tokens >= 3)
        await engine.abort("dp-aborted")
        (final,) = await deltas_of(stream)
        assert final.finish_reason == "abort"
        await wait_until(lambda: all(idle(r) for r in engine.replicas))
        assert engine.stats()["open_requests"] == 0 and [load.tokens for load in engine.router.loads] == [0, 0]


def test_delta_merger_equals_merge():
    rng_tokens = [[1, 2], [], [3], [4, 5, 6], [7]]
    lp = {9: Logprob(-0.5, 1)}
    deltas = [GenerationDelta("r", list(t), f"t{i}", [lp] * len(t) if i % 2 else None, num_prompt_tokens=4,
                              num_output_tokens=sum(len(x) for x in rng_tokens[:i + 1]), num_cached_tokens=i,
                              prompt_token_ids=[1, 2, 3, 4])
              for i, t in enumerate(rng_tokens)]
    deltas[-1].finish_reason, deltas[-1].stop_reason = "stop", "t4"
    originals = [list(d.token_ids) for d in deltas]
    merger = DeltaMerger(deltas[0])
    for d in deltas[1:]:
        merger.add(d)
    assert merger.finished
    reference = GenerationDelta(**{k: getattr(deltas[0], k) for k in GenerationDelta.__dataclass_fields__})
    for d in deltas[1:]:
        reference.merge(d)
    assert merger.result() == reference
    assert [d.token_ids for d in deltas] == originals  # the inputs' lists are never extended in place
    single = DeltaMerger(deltas[0])
    assert single.result() is deltas[0] and not single.finished


class _Recording:
    """A fake engine front end: records generate's keyword arguments."""

    def __init__(self) -> None:
        self.calls = []

    def generate(self, prompt, params, *, request_id, priority=0, **extra):
        self.calls.append(extra)

        async def one():
            yield GenerationDelta(request_id, [1], "a", None, finish_reason="length", num_output_tokens=1)
        return one()

    async def abort(self, request_id):
        pass


def test_fanout_passes_stream_false_only_for_non_streaming_requests():
    from aioinfer.entrypoints.openai.fanout import ChoiceSpec, ChoiceStreams

    specs = [ChoiceSpec(index=i, prompt_index=0, prompt=[1], params=SamplingParams()) for i in range(2)]
    engine = _Recording()

    async def main(stream):
        streams = ChoiceStreams.admit(engine, specs, "r", 0, stream=stream)
        return [delta.text async for _, delta in streams.merged()]

    assert anyio.run(main, False) == ["a", "a"] and engine.calls == [{"stream": False}] * 2
    engine.calls.clear()
    assert anyio.run(main, True) == ["a", "a"] and engine.calls == [{}] * 2  # older front ends keep working


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_openai_routes_use_final_only_for_non_stream(model_dir):
    """The real route on a real engine (in process): non-stream answers come from stream=False
    requests and equal the streamed answer; streamed ones keep streaming."""
    from aioinfer.entrypoints.openai.api_server import create_app
    from aioinfer.server_config import ServerConfig

    modes = []

    class RecordingEngine(Engine):
        def generate(self, *args, stream=True, **kwargs):
            if kwargs.get("request_id") != "aioinfer-warm-up":
                modes.append(stream)
            return super().generate(*args, stream=stream, **kwargs)

    config = ServerConfig.from_env({"AIOINFER_MODEL": model_dir, "AIOINFER_DTYPE": "float32",
                                    "AIOINFER_DEVICE": "cpu", "AIOINFER_LOG_REQUESTS": "false"})
    app = create_app(config, engine_factory=lambda **kwargs: RecordingEngine(**kwargs))
    body = {"model": "tiny", "prompt": "Hello world", "max_tokens": 12, "temperature": 0, "logprobs": 1,
            "ignore_eos": True}
    async with app.test_app() as test_app:
        client = test_app.test_client()
        await wait_until(lambda: app.extensions["aioinfer"].engine.is_ready, timeout=60)
        model = app.extensions["aioinfer"].served_model_name
        full = await (await client.post("/v1/completions", json={**body, "model": model})).get_json()
        response = await client.post("/v1/completions", json={**body, "model": model, "stream": True})
        events = (await response.get_data()).decode()
    assert modes == [False, True]
    import json
    chunks = [json.loads(line[len("data: "):]) for line in events.splitlines()
              if line.startswith("data: ") and line != "data: [DONE]"]
    choice = full["choices"][0]
    assert choice["text"] == "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert choice["finish_reason"] == "length" and full["usage"]["completion_tokens"] == 12
    assert choice["logprobs"]["tokens"] == [t for c in chunks if c["choices"]
                                            for t in (c["choices"][0]["logprobs"] or {}).get("tokens", [])]
