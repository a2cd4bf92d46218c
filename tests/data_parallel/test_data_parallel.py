"""Data parallelism on CPU: the router's choices on fixed inputs, replica placement, and two replicas
of a tiny real model behind one DataParallelEngine and behind one server — outputs equal to the
offline LLM, work on both replicas, aborts freeing KV on the replica that held it, one dead replica
making the whole engine dead."""

from __future__ import annotations

import anyio
import httpx
import pytest
from openai import OpenAI

import conftest
from aioinfer import LLM, DataParallelEngine, Engine, SamplingParams, create_engine
from aioinfer.config import EngineConfig
from aioinfer.data_parallel.placement import replica_devices
from aioinfer.data_parallel.router import Router
from aioinfer.errors import EngineDeadError, EngineNotReady
from aioinfer.server_config import ServerConfig
from server_process import metric, metric_samples, run_server
from engine_streams import collect
from tiny_models import make_tiny_model_dir

OPTIONS = dict(dtype="float32", device="cpu", max_num_batched_tokens=64, block_size=4)
GREEDY = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
SEEDED = SamplingParams(temperature=0.9, top_p=0.9, seed=3, max_tokens=10, ignore_eos=True)
PROMPTS = [[5, 9, 13, 200, 7], [42] * 3, list(range(30, 70)), [311, 17], "Hello world", "今天天气很好 🎉",
           list(range(100, 121)), [7] * 9]


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(make_tiny_model_dir(tmp_path_factory.mktemp("qwen2"), arch="qwen2"))


@pytest.fixture(scope="module")
def offline(model_dir):
    llm = LLM(model=model_dir, **OPTIONS)
    return {name: [o.outputs[0] for o in llm.generate(PROMPTS, params, use_tqdm=False)]
            for name, params in (("greedy", GREEDY), ("seeded", SEEDED))}


class Served:
    """An observer that records which replica served each request."""

    def __init__(self) -> None:
        self.engine_of: dict[str, int] = {}
        self.routed: list[tuple[int, bool]] = []

    def on_step(self, stats) -> None:
        pass

    def on_request_done(self, stats) -> None:
        self.engine_of[stats.request_id] = stats.engine_index

    def on_rejected(self, reason) -> None:
        pass

    def on_routed(self, engine_index, by_affinity) -> None:
        self.routed.append((engine_index, by_affinity))


def idle(replica) -> bool:
    return replica._core.kv_cache.all_free() and not replica._core.has_unfinished()


async def wait_until(predicate, timeout: float = 20) -> None:
    with anyio.fail_after(timeout):
        while not predicate():
            await anyio.sleep(0.01)


# ----------------------------------------------------------------------------- the router alone

def test_router_least_loaded_with_deterministic_ties():
    router = Router(3, block_size=4)
    assert router.block_hashes([1, 2, 3]) == []  # no full block
    order = []
    for cost in (100, 100, 100, 50, 10):
        route = router.choose([], [True] * 3)
        order.append(route.replica)
        router.add(route.replica, cost)
    # the least outstanding tokens; equal loads: the lowest index
    assert order == [0, 1, 2, 0, 1]
    assert [(load.requests, load.tokens) for load in router.loads] == [(2, 150), (2, 110), (1, 100)]
    # equal tokens: fewer open requests wins
    router.adjust(0, -50)  # progress: replica 0 now owes 100 tokens, as replica 2 does
    assert router.choose([], [True] * 3).replica == 2
    assert router.choose([], [True, True, False]).replica == 0  # only eligible replicas
    assert router.choose([], [False] * 3) is None
    router.remove(1, 110)
    assert router.choose([], [True] * 3).replica == 1
    # requests without max_tokens count at most max_output_estimate output tokens
    assert router.outstanding_tokens(30, 10**6) == 30 + router.max_output_estimate
    assert router.outstanding_tokens(0, -5) == 0


def test_router_prefix_affinity_within_the_margin_only():
    router = Router(2, block_size=4, affinity_margin_tokens=100, affinity_margin_ratio=0.5)
    prompt = list(range(1, 14))  # 3 full blocks + 1 token
    hashes = router.block_hashes(prompt)
    assert len(hashes) == 3 and hashes == router.block_hashes(prompt[:12] + [99])  # the partial block is left out
    assert router.block_hashes([9] + prompt[1:])[0] != hashes[0]
    router.record(hashes, 1)
    router.add(1, 90)  # replica 1 holds the prefix but has 90 tokens more than replica 0
    route = router.choose(hashes, [True, True])
    assert (route.replica, route.matched_blocks, route.by_affinity) == (1, 3, True)
    # a prompt that shares only the first two blocks matches two
    other = prompt[:8] + [77, 78, 79, 80]
    assert router.choose(router.block_hashes(other), [True, True]).matched_blocks == 2
    # past the margin (max(100, 0.5 x 0)): least loaded instead
    router.add(1, 20)
    route = router.choose(hashes, [True, True])
    assert (route.replica, route.by_affinity) == (0, False)
    # the relative margin grows with the least load: 0.5 x 400 = 200 >= 110 + 400 - 400
    router.add(0, 400)
    router.add(1, 400)
    assert router.choose(hashes, [True, True]).replica == 1
    # an ineligible owner is skipped
    assert router.choose(hashes, [True, False]).replica == 0


def test_router_longest_prefix_wins_and_the_map_is_bounded():
    router = Router(2, block_size=2, max_prefix_entries=4)
    long_prompt = [1, 2, 3, 4, 5, 6]
    router.record(router.block_hashes(long_prompt[:4]), 0)  # replica 0 served two blocks of it
    router.record(router.block_hashes(long_prompt), 1)  # replica 1 the same two and a third
    router.add(0, 10)
    router.add(1, 10)
    route = router.choose(router.block_hashes(long_prompt + [7, 8]), [True, True])
    assert (route.replica, route.matched_blocks) == (1, 3)
    router.record(router.block_hashes([9, 9, 8, 8]), 0)  # two new entries: the two oldest go
    assert len(router._prefix_owner) == 4
    # its first block was evicted, so nothing of it matches any more
    assert router.choose(router.block_hashes(long_prompt), [True, True]).matched_blocks == 0


def test_replica_devices():
    assert replica_devices("cpu", 2, 1, 0) == ["cpu", "cpu"]
    assert replica_devices("auto", 2, 1, 0) == ["cpu", "cpu"]
    assert replica_devices("auto", 2, 1, 2) == ["cuda:0", "cuda:1"]
    assert replica_devices("cuda:1", 2, 2, 5) == ["cuda:1", "cuda:3"]  # tensor-parallel ranks take the GPUs between
    with pytest.raises(ValueError, match="needs GPUs cuda:0..cuda:3"):
        replica_devices("cuda", 2, 2, 2)
    with pytest.raises(ValueError):
        replica_devices("mps", 2, 1, 0)


def test_configuration_paths():
    assert ServerConfig.from_env({"AIOINFER_DATA_PARALLEL_SIZE": "2"}).engine_kwargs["data_parallel_size"] == 2
    with pytest.raises(ValueError, match="DataParallelEngine"):
        Engine("unused", data_parallel_size=2)
    with pytest.raises(ValueError, match="DataParallelEngine"):
        LLM("unused", data_parallel_size=2)
    with pytest.raises(ValueError, match="data_parallel_size"):
        create_engine("unused", data_parallel_size=0)
    assert isinstance(create_engine("unused", device="cpu", data_parallel_size=2), DataParallelEngine)
    engine = create_engine("unused", device="cpu", data_parallel_size=3, max_waiting_requests=7, block_size=8)
    assert [r.config.device for r in engine.replicas] == ["cpu"] * 3
    assert all(r.config.parallel.data_parallel_size == 1 and r.max_waiting_requests == 7
               and r.config.cache.block_size == 8 for r in engine.replicas)
    # tensor_parallel_size reaches each replica unchanged; two tensor-parallel replicas cannot share a
    # process (one torch.distributed default group each), which is refused before anything loads
    single = DataParallelEngine("unused", device="cpu", data_parallel_size=1, tensor_parallel_size=2)
    assert single.replicas[0].config.parallel.tensor_parallel_size == 2
    with pytest.raises(ValueError, match="a process of its own"):
        create_engine("unused", device="cpu", data_parallel_size=2, tensor_parallel_size=2)


# ----------------------------------------------------------------------------- two replicas, one engine

@pytest.mark.anyio
async def test_concurrent_requests_equal_offline_and_both_replicas_serve(model_dir, offline):
    served = Served()
    results = {}
    async with DataParallelEngine(model_dir, data_parallel_size=2, observers=[served], **OPTIONS) as engine:
        assert engine.is_ready and not engine.is_dead
        first, second = engine.replicas
        # weights loaded once per replica; the tokenizer once in all; both cores under the KV-leak check
        assert first._core.loaded.model is not second._core.loaded.model
        assert first.tokenizer is second.tokenizer is engine.tokenizer
        assert {id(first._core), id(second._core)} <= {id(core) for core in conftest._live_engines}

        async def run(name, params, i, repeat):
            stream = engine.generate(PROMPTS[i], params, request_id=f"{name}-{i}-{repeat}")
            results[name, i, repeat] = await collect(stream)

        async with anyio.create_task_group() as tg:
            for repeat in range(2):
                for name, params in (("greedy", GREEDY), ("seeded", SEEDED)):
                    for i in range(len(PROMPTS)):
                        tg.start_soon(run, name, params, i, repeat)
        for (name, i, _), (tokens, text, last) in results.items():
            expected = offline[name][i]
            assert tokens == expected.token_ids and text == expected.text
            assert last.finish_reason == "length"
        stats = engine.stats()
        per_replica = [s["routed"] for s in stats["replicas"]]
        assert sum(per_replica) == len(results) and min(per_replica) >= len(results) // 4, per_replica
        assert sorted(set(served.engine_of[rid] for rid in (f"greedy-{i}-0" for i in range(8)))) == [0, 1]
        assert len(served.routed) == len(results)
        assert stats["open_requests"] == 0 and [load.tokens for load in engine.router.loads] == [0, 0]
        # loads stay far within the affinity margin here, so every copy of a prompt with a full block
        # (greedy, seeded, twice) follows the first copy to its replica
        for i, prompt in enumerate(PROMPTS):
            where = {served.engine_of[f"{name}-{i}-{r}"] for name in ("greedy", "seeded") for r in range(2)}
            assert len(where) == 1 or len(engine.tokenize(prompt)) < OPTIONS["block_size"], (i, where)
        assert any(by_affinity for _, by_affinity in served.routed)
        await wait_until(lambda: idle(first) and idle(second))
    assert not engine.is_ready and not any(r._loop.thread.is_alive() for r in engine.replicas)
    with pytest.raises(EngineNotReady):
        engine.generate(PROMPTS[0], GREEDY)


@pytest.mark.anyio
async def test_prefix_affinity_end_to_end(model_dir):
    served = Served()
    shared = list(range(40, 60))  # five blocks of 4
    quick = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    async with DataParallelEngine(model_dir, data_parallel_size=2, observers=[served], **OPTIONS) as engine:
        await collect(engine.generate(shared + [1], quick, request_id="a"))  # idle: replica 0
        busy = engine.generate([3, 4], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True),
                               request_id="busy")  # replica 0 again (both idle); now it has more load
        await collect(engine.generate(shared + [2, 3], quick, request_id="b"))  # its prefix: replica 0 anyway
        await collect(engine.generate([8, 8, 8, 8, 9], quick, request_id="c"))  # no prefix: least loaded, 1
        await collect(busy)
    assert [served.engine_of[r] for r in "abc"] == [0, 0, 1] and served.engine_of["busy"] == 0
    assert served.routed == [(0, False), (0, False), (0, True), (1, False)]


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_abort_and_cancel_free_kv_on_the_right_replica(model_dir):
    long = SamplingParams(temperature=0, max_tokens=300, ignore_eos=True)
    async with DataParallelEngine(model_dir, data_parallel_size=2, max_num_seqs=1, **OPTIONS) as engine:
        first, second = engine.replicas
        on_first = engine.generate(PROMPTS[2], long, request_id="on-first")  # both idle: replica 0
        on_second = engine.generate(PROMPTS[0], long, request_id="on-second")  # replica 0 is busier: 1
        queued = engine.generate(PROMPTS[1], long, request_id="queued")  # waits behind one of them
        assert (await on_first.__anext__()).token_ids and (await on_second.__anext__()).token_ids
        assert not idle(first) and not idle(second)

        await engine.abort("on-second")  # by id, from another task's point of view
        rest = [d async for d in on_second]
        assert rest[-1].finish_reason == "abort"
        await engine.abort("on-second")  # twice is harmless
        await engine.abort("never-existed")
        # "queued" (replica 0: 340 outstanding tokens, replica 1: 305) waits behind "on-second" and
        # may have started once that one was aborted; aborted too, it leaves replica 1 idle
        assert engine._open["queued"].replica == 1
        await engine.abort("queued")
        assert [d async for d in queued][-1].finish_reason == "abort"
        await wait_until(lambda: idle(second))
        assert not idle(first)  # "on-first" still holds its blocks on replica 0

        async for delta in on_first:  # break out mid-stream: the request is aborted on replica 0
            if delta.num_output_tokens >= 5:
                break
        await on_first.aclose()
        await wait_until(lambda: idle(first) and idle(second))
        stats = engine.stats()
        assert stats["open_requests"] == 0 and stats["aborted"] == 3
        assert [load.requests for load in engine.router.loads] == [0, 0]


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_one_dead_replica_makes_the_engine_dead(model_dir):
    # Each replica counts its own steps (the warm-up is step 1): replica 0 finishes a one-token
    # request in step 2; replica 1 fails in step 3, decoding the long request.
    async with DataParallelEngine(model_dir, data_parallel_size=2, fault_inject_step=3, **OPTIONS) as engine:
        short = engine.generate(PROMPTS[0], SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
        doomed = engine.generate(PROMPTS[1], SamplingParams(temperature=0, max_tokens=50, ignore_eos=True))
        tokens, _, last = await collect(short)
        assert len(tokens) == 1 and last.finish_reason == "length"
        with pytest.raises(EngineDeadError):
            await collect(doomed)
        assert engine.is_dead and not engine.is_ready
        assert engine.replicas[1].is_dead and not engine.replicas[0].is_dead
        with pytest.raises(EngineDeadError):
            engine.generate(PROMPTS[0], GREEDY)
        assert engine.stats()["dead"]


@pytest.mark.anyio
async def test_a_replica_that_fails_to_load_fails_the_start(tmp_path):
    engine = DataParallelEngine(str(tmp_path / "missing"), data_parallel_size=2, device="cpu")
    with pytest.raises(FileNotFoundError, match="missing"):
        async with engine:
            pass
    assert not engine.is_ready and engine.replicas[1]._loop is None  # the second one was never started
    assert not engine.replicas[0]._loop.thread.is_alive()


# ----------------------------------------------------------------------------- one server over two replicas

def test_server_with_two_replicas(model_dir, tmp_path):
    env = {"AIOINFER_MODEL": model_dir, "AIOINFER_DEVICE": "cpu", "AIOINFER_DTYPE": "float32",
           "AIOINFER_MAX_MODEL_LEN": "256", "AIOINFER_NUM_KV_BLOCKS": "256"}
    argv = ["{python}", "-m", "aioinfer", "serve", "--port", "{port}", "--data-parallel-size", "2"]
    llm = LLM(model=model_dir, dtype="float32", device="cpu", max_model_len=256, num_kv_blocks=256)
    prompts = [[5, 9, 13, 200, 7], list(range(30, 70)), [42] * 3, [311, 17, 99, 4, 8, 15]]
    short = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)
    long = llm.generate([[9, 8, 7]], SamplingParams(temperature=0, max_tokens=200, ignore_eos=True), use_tqdm=False)
    with run_server(env, tmp_path, argv=argv) as server:
        client = OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
        model = client.models.list().data[0].id

        def complete(prompt, max_tokens=8, stream=False):
            return client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                             stream=stream, extra_body={"ignore_eos": True})

        # A long stream holds replica 0 (the first request goes there); the short ones arrive while
        # it runs, so the router sends them to replica 1 first, then wherever the load is lower.
        stream = complete([9, 8, 7], max_tokens=200, stream=True)
        chunks = [next(stream).choices[0].text]
        import concurrent.futures

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            texts = [c.choices[0].text for c in pool.map(complete, prompts * 3)]
        chunks += [c.choices[0].text for c in stream]
        assert texts == [o.outputs[0].text for o in short] * 3
        assert "".join(chunks) == long[0].outputs[0].text
        chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hello"}],
                                              max_tokens=4)
        assert chat.choices[0].finish_reason in ("stop", "length")
        assert httpx.get(server.url + "/health").status_code == 200
        assert httpx.get(server.url + "/ready").status_code == 200

        samples = metric_samples(server)
        routed = [metric(samples, "aioinfer:router_requests_total", engine=e) for e in ("0", "1")]
        assert sum(routed) == 14 and min(routed) >= 1, routed
        for engine in ("0", "1"):  # each replica's series: at least one routed request (warm-ups are not counted)
            assert metric(samples, "vllm:request_success_total", engine=engine) >= 1, engine
            assert any(n == "vllm:kv_cache_usage_perc" and lab.get("engine") == engine for n, lab, _ in samples)
        assert metric(samples, "vllm:request_success_total") == 14
        assert metric(samples, "aioinfer:http_requests_total", status="200") >= 14


def test_server_env_reaches_parallel_and_kv_options():
    from aioinfer.server_config import ServerConfig

    kwargs = ServerConfig.from_env({"AIOINFER_TENSOR_PARALLEL_SIZE": "2", "AIOINFER_PREEMPTION_MODE": "swap",
                                    "AIOINFER_SWAP_SPACE_GIB": "0.5", "AIOINFER_ENABLE_PREFIX_CACHING": "false"}
                                   ).engine_kwargs
    assert (kwargs["tensor_parallel_size"], kwargs["preemption_mode"], kwargs["swap_space_gib"],
            kwargs["enable_prefix_caching"]) == (2, "swap", 0.5, False)
    config = EngineConfig.from_kwargs("unused", **{k: kwargs[k] for k in (
        "tensor_parallel_size", "preemption_mode", "swap_space_gib", "enable_prefix_caching")})
    assert config.parallel.tensor_parallel_size == 2 and config.scheduler.preemption_mode == "swap"
    assert config.cache.swap_space_gib == 0.5 and config.cache.enable_prefix_caching is False
