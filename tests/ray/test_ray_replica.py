"""``EngineReplica`` as Ray Serve drives it, in this process (the class needs no Ray to run): built with
``async __init__``, its stream's messages (admission, deltas, the final delta with the engine's record,
a refusal), a cancelled stream aborting its request, and ``__del__``'s awaitable leaving the engine."""

from __future__ import annotations

import asyncio

import pytest

from aioinfer.async_engine.stats import RequestStats
from aioinfer.engine.delta import GenerationDelta
from aioinfer.ray.replica import EngineReplica
from aioinfer.ray.wire import ADMITTED, ERROR, FINAL, error_of
from aioinfer.sampling_params import SamplingParams
from tiny_models import make_tiny_model_dir


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(make_tiny_model_dir(tmp_path_factory.mktemp("qwen2"), arch="qwen2"))


async def _replica(model_dir) -> EngineReplica:
    replica = EngineReplica.__new__(EngineReplica)  # as Ray Serve builds a deployment with an async __init__
    await replica.__init__({"model": model_dir, "device": "cpu", "dtype": "float32", "max_model_len": 128,
                            "num_kv_blocks": 64, "cpu_threads": 1})
    return replica


def test_stream_messages_cancellation_and_shutdown(model_dir):
    async def main():
        replica = await _replica(model_dir)
        info = await replica.info()
        assert info["max_model_len"] == 128 and info["block_size"] == 16 and info["replica_id"] is None

        items = [item async for item in replica.generate([5, 6, 7, 8], SamplingParams(max_tokens=5, ignore_eos=True),
                                                         "r1")]
        assert items[0] == (ADMITTED, None)
        assert all(isinstance(item, GenerationDelta) for item in items[1:-1])
        kind, last, stats = items[-1]
        assert kind == FINAL and last.finish_reason == "length"
        assert isinstance(stats, RequestStats) and stats.request_id == "r1" and stats.num_output_tokens == 5
        assert sum(len(d.token_ids) for d in [*items[1:-1], last]) == 5

        refused = [item async for item in replica.generate([5] * 100, SamplingParams(max_tokens=100), "r2")]
        assert len(refused) == 1 and refused[0][0] == ERROR
        assert "maximum context length" in str(error_of(refused[0]))

        # The caller left: Ray cancels the task that runs the stream (separate-thread mode, its default).
        first_delta = asyncio.Event()

        async def consume():
            async for item in replica.generate([5, 6, 7], SamplingParams(max_tokens=100, ignore_eos=True), "r3"):
                if isinstance(item, GenerationDelta):
                    first_delta.set()

        task = asyncio.create_task(consume())
        await first_delta.wait()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        stats = await replica.stats()
        assert stats["open_requests"] == 0 and stats["aborted"] == 1
        figures = await replica.record_routing_stats()
        assert figures["step_totals"]["num_generation_tokens"] >= 6
        await replica.check_health()

        stop = replica.__del__()  # Ray Serve's graceful stop awaits this
        assert stop is not None
        await stop
        assert replica.__del__() is None  # the garbage collector's call afterwards does nothing
        with pytest.raises(RuntimeError, match="stopped"):
            await replica.check_health()

    asyncio.run(main())


def test_replicas_of_one_node_publish_kv_events_on_their_own_ports():
    from aioinfer.config import KVEventsConfig
    from aioinfer.ray.replica import with_replica_event_endpoints

    kwargs = {"model": "m", "kv_events_config": {"enable_kv_cache_events": True, "endpoint": "tcp://*:5557",
                                                 "replay_endpoint": "tcp://*:5600"}}
    assert with_replica_event_endpoints(kwargs, 0) is kwargs
    moved = with_replica_event_endpoints(kwargs, 2)["kv_events_config"]
    assert isinstance(moved, KVEventsConfig)
    assert (moved.endpoint, moved.replay_endpoint) == ("tcp://*:5559", "tcp://*:5602")
    off = {"model": "m", "kv_events_config": '{"enable_kv_cache_events": false}'}
    assert with_replica_event_endpoints(off, 3) is off
    assert with_replica_event_endpoints({"model": "m"}, 1) == {"model": "m"}
