"""The embeddable async Engine on a real tiny model: equality with the offline LLM, cancellation,
backpressure, overload, deadlines, failure injection and a clean exit, under asyncio and trio."""

from __future__ import annotations

import threading

import anyio
import pytest

from aioinfer import LLM, Engine, SamplingParams
from aioinfer.errors import EngineDeadError, EngineNotReady, EngineOverloaded, RequestDeadlineExceeded, SlowConsumerError
from engine_streams import collect
from tiny_models import make_tiny_model_dir

PROMPTS = [[5, 9, 13, 200, 7], [42] * 3, list(range(30, 70)), [311, 17], "Hello world", "今天天气很好 🎉"]
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
SEEDED = SamplingParams(temperature=0.9, top_p=0.9, seed=5, max_tokens=12, ignore_eos=True)
OPTIONS = dict(dtype="float32", device="cpu", max_num_batched_tokens=64)


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request):
    return request.param


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(make_tiny_model_dir(tmp_path_factory.mktemp("qwen2"), arch="qwen2"))


@pytest.fixture(scope="module")
def offline(model_dir):
    llm = LLM(model=model_dir, **OPTIONS)
    return {name: [o.outputs[0] for o in llm.generate(PROMPTS, params, use_tqdm=False)]
            for name, params in (("greedy", GREEDY), ("seeded", SEEDED))}


async def wait_until_idle(engine: Engine) -> None:
    """The GPU thread applies aborts at its next step boundary; wait (bounded) until it has."""
    with anyio.fail_after(10):
        while not (engine._core.kv_cache.all_free() and not engine._core.has_unfinished()):
            await anyio.sleep(0.01)


@pytest.mark.anyio
async def test_concurrent_generate_equals_offline_llm(model_dir, offline):
    results = {}
    async with Engine(model_dir, **OPTIONS) as engine:
        assert engine.is_ready

        async def run(name, params, i):
            results[name, i] = await collect(engine.generate(PROMPTS[i], params))

        async with anyio.create_task_group() as tg:
            for name, params in (("greedy", GREEDY), ("seeded", SEEDED)):
                for i in range(len(PROMPTS)):
                    tg.start_soon(run, name, params, i)
        for (name, i), (tokens, text, last) in results.items():
            expected = offline[name][i]
            assert tokens == expected.token_ids and text == expected.text
            assert last.finish_reason == expected.finish_reason and last.num_output_tokens == len(tokens)
        await wait_until_idle(engine)
    assert not engine._loop.thread.is_alive()


@pytest.mark.anyio
async def test_break_cancel_and_abort_free_blocks(model_dir):
    long = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
    async with Engine(model_dir, **OPTIONS, max_num_seqs=1) as engine:
        # break out of the loop mid-stream
        stream = engine.generate(PROMPTS[2], long)
        async for delta in stream:
            if delta.num_output_tokens >= 3:
                break
        await stream.aclose()
        await wait_until_idle(engine)

        # cancel the consuming task while one request runs and another is still queued
        started = anyio.Event()

        async def consume(prompt):
            async for _ in engine.generate(prompt, long):
                started.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(consume, PROMPTS[0])
            tg.start_soon(consume, PROMPTS[1])  # max_num_seqs=1: waits in the queue
            await started.wait()
            tg.cancel_scope.cancel()
        await wait_until_idle(engine)

        # abort by id from another task: the consumer gets a final "abort" delta
        stream = engine.generate(PROMPTS[3], long, request_id="victim")
        first = await stream.__anext__()
        await engine.abort("victim")
        rest = [d async for d in stream]
        assert rest[-1].finish_reason == "abort" and not first.finished
        await engine.abort("victim")  # twice is harmless
        await wait_until_idle(engine)
        assert engine.stats()["open_requests"] == 0


@pytest.mark.anyio
async def test_deadline_aborts(model_dir):
    async with Engine(model_dir, **OPTIONS) as engine:
        stream = engine.generate(PROMPTS[0], SamplingParams(max_tokens=10_000 // 100, ignore_eos=True, temperature=0),
                                 deadline=anyio.current_time())  # already passed
        with pytest.raises(RequestDeadlineExceeded):
            await collect(stream)
        await wait_until_idle(engine)


@pytest.mark.anyio
async def test_overload_is_refused_at_once(model_dir):
    async with Engine(model_dir, **OPTIONS, max_waiting_requests=2) as engine:
        streams = [engine.generate(PROMPTS[0], GREEDY), engine.generate(PROMPTS[1], GREEDY)]
        with pytest.raises(EngineOverloaded) as info:
            engine.generate(PROMPTS[2], GREEDY)
        assert info.value.retry_after > 0 and engine.counters["rejected_overloaded"] == 1
        for stream in streams:  # the accepted ones complete
            tokens, _, last = await collect(stream)
            assert len(tokens) == 12 and last.finish_reason == "length"
        assert len(await collect(engine.generate(PROMPTS[2], GREEDY))) == 3  # room again
        with pytest.raises(ValueError, match="maximum context length"):
            engine.generate([1] * 5000, GREEDY)
        await wait_until_idle(engine)


async def cut_off_as_slow(engine: Engine, stream) -> None:
    """Wait (bounded) until the watchdog aborted a stalled consumer; its stream then raises."""
    with anyio.fail_after(20):
        while engine.counters["aborted_slow_consumer"] == 0:
            await anyio.sleep(0.05)
    with pytest.raises(SlowConsumerError):
        await collect(stream)


@pytest.mark.anyio
async def test_stall_counts_from_the_first_unread_delta_not_from_a_full_buffer(model_dir):
    # The buffer holds the whole request (no overflow ever): a consumer that stops reading is still
    # cut off once it has left output unread for the limit, and the relay probe's clock counts too.
    async with Engine(model_dir, **OPTIONS, stream_buffer_size=100_000, stall_timeout=0.2) as engine:
        stream = engine.generate([7], SamplingParams(temperature=0, max_tokens=None, ignore_eos=True))
        await stream.__anext__()
        await cut_off_as_slow(engine, stream)

        cut_off = []

        class Recipient:  # an HTTP client behind the consumer that stopped taking data at t = 0
            def __call__(self, now):
                return 0.0

            def on_stalled(self):
                cut_off.append(True)

        stream = engine.generate([7], SamplingParams(temperature=0, max_tokens=None, ignore_eos=True),
                                 stall_probe=Recipient())
        with pytest.raises(SlowConsumerError):  # the consumer reads at once; its recipient does not
            with anyio.fail_after(20):
                async for _ in stream:
                    pass
        assert cut_off == [True] and engine.counters["aborted_slow_consumer"] == 2
        await wait_until_idle(engine)


@pytest.mark.anyio
async def test_a_failing_stall_probe_is_no_information_and_never_ends_the_engine(model_dir, offline):
    # An HTTP response's probe reads a socket the client may have closed already; whatever it
    # raises, the watchdog that samples it must go on, and so must the engine and its requests.
    async with Engine(model_dir, **OPTIONS, stall_timeout=0.2) as engine:
        calls = []

        def gone(now):
            calls.append(now)
            raise OSError(9, "Bad file descriptor")

        stream = engine.generate([7], SamplingParams(temperature=0, max_tokens=None, ignore_eos=True),
                                 stall_probe=gone)
        with anyio.fail_after(20):
            while not calls:  # the watchdog sampled it (and the request is still running: ~470 steps)
                await anyio.sleep(0.02)
            async for delta in stream:
                if len(delta.token_ids) and delta.finish_reason is None:
                    break
        await stream.aclose()
        assert len(calls) == 1, "a probe that failed is dropped, not called again"
        assert not engine.is_dead and engine.counters["aborted_slow_consumer"] == 0
        tokens, text, _ = await collect(engine.generate(PROMPTS[0], GREEDY))
        assert tokens == offline["greedy"][0].token_ids and text == offline["greedy"][0].text
        await wait_until_idle(engine)


@pytest.mark.anyio
async def test_slow_consumer_gets_merged_deltas_then_is_cut_off(model_dir, offline):
    async with Engine(model_dir, **OPTIONS, stream_buffer_size=1) as engine:
        # slow but alive: it reads after the whole request was produced; nothing is dropped
        stream = engine.generate(PROMPTS[0], GREEDY)
        await wait_until_idle(engine)
        tokens, text, last = await collect(stream)
        assert tokens == offline["greedy"][0].token_ids and text == offline["greedy"][0].text

    async with Engine(model_dir, **OPTIONS, stream_buffer_size=1, stall_timeout=0.05) as engine:
        # stalled: reads one delta, then nothing for longer than the limit (the request needs ~470 steps)
        stream = engine.generate([7], SamplingParams(temperature=0, max_tokens=None, ignore_eos=True))
        await stream.__anext__()
        await cut_off_as_slow(engine, stream)
        await wait_until_idle(engine)


@pytest.mark.anyio
async def test_step_loop_failure_reaches_every_request(model_dir):
    async with Engine(model_dir, **OPTIONS, fault_inject_step=4) as engine:  # warm-up takes step 1
        streams = [engine.generate(p, SamplingParams(temperature=0, max_tokens=50, ignore_eos=True))
                   for p in PROMPTS[:3]]
        for stream in streams:
            with pytest.raises(EngineDeadError):
                await collect(stream)
        assert engine.is_dead and not engine.is_ready
        with pytest.raises(EngineDeadError):
            engine.generate(PROMPTS[0], GREEDY)
    assert not engine._loop.thread.is_alive()


@pytest.mark.anyio
async def test_a_broken_result_hand_over_kills_the_engine_instead_of_hanging(model_dir, monkeypatch):
    """The GPU thread cannot reach the loop through the bridge (as with an anyio whose backend
    lacked run_sync_soon): its failure still reaches every consumer, directly."""
    from aioinfer.async_engine.loop_bridge import LoopBridge

    def broken(self):
        raise AttributeError("no way to schedule on this loop")

    async with Engine(model_dir, **OPTIONS) as engine:  # the warm-up step still goes through
        monkeypatch.setattr(LoopBridge, "_schedule_drain", broken)
        with anyio.fail_after(30):
            with pytest.raises(EngineDeadError):
                await collect(engine.generate(PROMPTS[0], GREEDY))
        assert engine.is_dead
    assert not engine._loop.thread.is_alive()


@pytest.mark.anyio
async def test_embedded_in_a_host_task_group_exits_cleanly(model_dir, anyio_backend):
    threads_before = {t.ident for t in threading.enumerate()}
    async with anyio.create_task_group() as host:
        async with Engine(model_dir, **OPTIONS) as engine:
            done = []

            async def client(i):
                done.append(await collect(engine.generate(PROMPTS[i], GREEDY)))

            for i in range(4):
                host.start_soon(client, i)
            with anyio.fail_after(60):
                while len(done) < 4:
                    await anyio.sleep(0.01)
        with pytest.raises(EngineNotReady):
            engine.generate(PROMPTS[0], GREEDY)
    assert not engine._loop.thread.is_alive()
    assert not ({t.ident for t in threading.enumerate() if t.name == "aioinfer-gpu"} - threads_before)
    if anyio_backend == "asyncio":
        import asyncio

        # Only this test's task and the anyio pytest runner's own task may remain.
        others = [t for t in asyncio.all_tasks() - {asyncio.current_task()}
                  if "TestRunner" not in t.get_coro().__qualname__]
        assert not others, others
