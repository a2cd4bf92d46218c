"""KV-cache events in vLLM's ZeroMQ format (engine/kv_events_publisher.py), on the real engine path.

A real pyzmq SUB socket subscribes to an engine on the tiny model and decodes every message with
msgspec structs written here as vLLM's subscriber example (examples/online_serving/
kv_events_subscriber.py, v0.26: events as maps) defines them: stores carry each block's tokens and
chain, removals name hashes stored before, a reset is AllBlocksCleared, sequence numbers count from
0 without gaps, and the replay socket resends buffered batches. Without the option no publisher
thread exists and the core records nothing.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any, Optional, Union

import msgspec
import pytest
import zmq

from aioinfer import LLM, SamplingParams
from tiny_models import make_tiny_model_dir

BLOCK = 4
TOPIC = "kv-events"
U64 = (1 << 64) - 1


# ---------------------------------------------------------------------------- vLLM's structs (v0.26)

class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: Optional[int] = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """Base class for all KV cache-related events"""


class BlockStored(KVCacheEvent):
    block_hashes: list[Union[int, bytes]]
    parent_block_hash: Union[int, bytes, None]
    token_ids: list[int]
    block_size: int
    lora_id: Optional[int]
    medium: Optional[str]
    lora_name: Optional[str]
    extra_keys: Optional[list[Optional[tuple[Any, ...]]]] = None
    group_idx: Optional[int] = None
    kv_cache_spec_kind: Optional[str] = None
    kv_cache_spec_sliding_window: Optional[int] = None
    locality: Optional[str] = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[Union[int, bytes]]
    medium: Optional[str]
    group_idx: Optional[int] = None
    locality: Optional[str] = None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[Union[BlockStored, BlockRemoved, AllBlocksCleared]]


DECODER = msgspec.msgpack.Decoder(type=KVEventBatch)


# vLLM's structs up to v0.25: every event a positional array led by its type
class OldEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    """Base class for all KV cache-related events"""


class OldStored(OldEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: Optional[int]
    token_ids: list[int]
    block_size: int
    lora_id: Optional[int]
    medium: Optional[str]
    lora_name: Optional[str]
    extra_keys: Optional[list] = None
    group_idx: Optional[int] = None
    kv_cache_spec_kind: Optional[str] = None


class OldRemoved(OldEvent, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: Optional[str]
    group_idx: Optional[int] = None


class OldCleared(OldEvent, tag="AllBlocksCleared"):
    pass


class OldBatch(EventBatch):
    events: list[Union[OldStored, OldRemoved, OldCleared]]


# ---------------------------------------------------------------------------- helpers

@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model_dir(tmp_path_factory.mktemp("qwen2-kv-events"), arch="qwen2")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Subscriber:
    """A SUB socket on the engine's endpoint, collecting (seq, batch) in arrival order."""

    def __init__(self, endpoint: str, topic: str = TOPIC) -> None:
        self.ctx = zmq.Context.instance()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
        self.sub.connect(endpoint)
        self.topic = topic.encode()
        self.received: list[tuple[int, KVEventBatch]] = []

    def take(self, timeout_ms: int) -> bool:
        if not self.sub.poll(timeout_ms):
            return False
        topic, seq, payload = self.sub.recv_multipart()
        assert topic == self.topic and len(seq) == 8
        self.received.append((int.from_bytes(seq, "big"), DECODER.decode(payload)))
        return True

    def wait_subscribed(self, llm) -> None:
        """The subscription reaches the PUB socket some time after connect (ZeroMQ's slow joiner): reset the
        (empty) cache, a batch with no other effect, until one arrives."""
        for _ in range(100):
            assert llm.reset_prefix_cache()
            if self.take(100):
                return
        pytest.fail("the subscription never reached the publisher")

    def collect(self, publisher, timeout_s: float = 30.0) -> None:
        """Everything the engine has published so far (bounded polling: no timing assumption)."""
        deadline = time.monotonic() + timeout_s
        while not self.received or self.received[-1][0] < publisher.num_batches - 1:
            assert time.monotonic() < deadline, f"got up to {self.received[-1:]} of {publisher.num_batches}"
            self.take(100)

    def close(self) -> None:
        self.sub.close(linger=0)


def replay(endpoint: str, start: int) -> list[tuple[int, bytes]]:
    """Ask the replay socket for the batches from ``start`` (a DEALER: a REQ socket takes one reply only)."""
    dealer = zmq.Context.instance().socket(zmq.DEALER)
    dealer.connect(endpoint)
    try:
        dealer.send_multipart([b"", start.to_bytes(8, "big")])
        got = []
        while True:
            assert dealer.poll(30_000), "no replay answer"
            empty, topic, seq, payload = dealer.recv_multipart()
            assert empty == b""
            if seq == (-1).to_bytes(8, "big", signed=True):
                assert topic == b"" and payload == b""
                return got
            assert topic == TOPIC.encode()
            got.append((int.from_bytes(seq, "big"), payload))
    finally:
        dealer.close(linger=0)


def blocks_of(event: BlockStored) -> list[tuple[int, Optional[int], list[int]]]:
    """(hash, parent hash, tokens) of each block of a BlockStored."""
    assert len(event.token_ids) == event.block_size * len(event.block_hashes)
    parents = [event.parent_block_hash, *event.block_hashes[:-1]]
    return [(h, parents[i], event.token_ids[i * event.block_size:(i + 1) * event.block_size])
            for i, h in enumerate(event.block_hashes)]


def chain(tokens: list[int], stored: dict[int, tuple[Optional[int], list[int]]]) -> list[int]:
    """The stored hashes of ``tokens``' leading full blocks, following parents from the first block."""
    found, parent = [], None
    for i in range(len(tokens) // BLOCK):
        want = tokens[i * BLOCK:(i + 1) * BLOCK]
        match = [h for h, (p, toks) in stored.items() if p == parent and toks == want]
        if not match:
            break
        assert len(match) == 1
        parent = match[0]
        found.append(parent)
    return found


def publisher_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "aioinfer-kv-events"]


GREEDY = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)


# ---------------------------------------------------------------------------- the offline LLM

def test_events_follow_the_prefix_cache(model_dir, tmp_path):
    endpoint, replay_endpoint = f"ipc://{tmp_path}/kv.sock", f"ipc://{tmp_path}/replay.sock"
    sub = Subscriber(endpoint)  # connected before the engine binds: ZeroMQ connects once it does
    llm = LLM(model=str(model_dir), dtype="float32", device="cpu", block_size=BLOCK, num_kv_blocks=16,
              max_num_batched_tokens=64, kv_events_config={
                  "enable_kv_cache_events": True, "publisher": "zmq", "endpoint": endpoint,
                  "replay_endpoint": replay_endpoint, "topic": TOPIC, "buffer_steps": 1000})
    publisher = llm.engine.kv_events_publisher
    try:
        assert len(publisher_threads()) == 1
        sub.wait_subscribed(llm)
        shared = [5, 9, 13, 200, 7, 42, 42, 42, 311, 17, 99, 98]  # three full blocks
        a = shared + [30, 31, 32, 33, 34]
        b = shared + [60, 61, 62, 63, 64]
        out_a = llm.generate([a], GREEDY, use_tqdm=False)[0].outputs[0].token_ids
        llm.generate([b], GREEDY, use_tqdm=False)
        sub.collect(publisher)

        stored: dict[int, tuple[Optional[int], list[int]]] = {}
        events = [e for _, batch in sub.received for e in batch.events]
        for event in events:
            if isinstance(event, BlockStored):
                assert (event.block_size, event.medium, event.group_idx, event.lora_id) == (BLOCK, "GPU", 0, None)
                assert event.kv_cache_spec_kind == "full_attention" and event.extra_keys == [None] * len(
                    event.block_hashes)
                for h, parent, toks in blocks_of(event):
                    assert isinstance(h, int) and 0 <= h <= U64 and h not in stored
                    stored[h] = (parent, toks)
        # a's computed tokens: its prompt and all but its last output token (4 full blocks of 19)
        chain_a = chain(a + out_a, stored)
        assert len(chain_a) == 4 and stored[chain_a[0]][0] is None
        # b hit a's three shared blocks: its fourth block is stored once, as their child
        chain_b = chain(b, stored)
        assert chain_b[:3] == chain_a[:3] and len(chain_b) == 4 and chain_b[3] != chain_a[3]
        assert stored[chain_b[3]] == (chain_a[2], b[12:16])
        # the hashes are the prefix cache's own keys, as unsigned 64-bit ints
        cache = llm.engine.kv_cache.prefix_cache
        live = {cache.entry(i)[1] & U64 for i in range(llm.engine.kv_cache.pool.num_blocks) if cache.entry(i)}
        assert set(chain_a) | set(chain_b) <= live

        # A long prompt needs the free cached blocks back: their keys are removed
        c = list(range(100, 140))  # 10 blocks of a 15-block pool
        llm.generate([c], GREEDY, use_tqdm=False)
        sub.collect(publisher)
        mirror: set[int] = set()
        removed: list[int] = []
        for _, batch in sub.received:
            for event in batch.events:
                if isinstance(event, BlockStored):
                    assert not mirror & set(event.block_hashes)
                    mirror |= set(event.block_hashes)
                elif isinstance(event, BlockRemoved):
                    assert event.medium == "GPU" and set(event.block_hashes) <= mirror
                    mirror -= set(event.block_hashes)
                    removed += event.block_hashes
                else:
                    mirror.clear()
        assert set(removed) & (set(chain_a) | set(chain_b)), "no block of a or b was evicted"
        live = {cache.entry(i)[1] & U64 for i in range(llm.engine.kv_cache.pool.num_blocks) if cache.entry(i)}
        assert mirror == live  # the subscriber's view is the cache's

        # A reset clears everything
        assert llm.reset_prefix_cache() and len(cache) == 0
        sub.collect(publisher)
        assert [type(e) for e in sub.received[-1][1].events] == [AllBlocksCleared]

        # Sequence numbers: consecutive from the first received, and every earlier one replayable
        seqs = [seq for seq, _ in sub.received]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))) and seqs[-1] == publisher.num_batches - 1
        assert all(batch.data_parallel_rank == 0 and batch.ts > 0 for _, batch in sub.received)
        replayed = replay(replay_endpoint, 0)
        assert [seq for seq, _ in replayed] == list(range(publisher.num_batches))
        middle = seqs[len(seqs) // 2]
        tail = replay(replay_endpoint, middle)
        assert [seq for seq, _ in tail] == list(range(middle, publisher.num_batches))
        live_batches = dict(sub.received)
        assert all(DECODER.decode(payload) == live_batches[seq] for seq, payload in tail)
        assert publisher.num_dropped == 0
    finally:
        llm.shutdown()
        sub.close()
    assert not publisher.thread.is_alive()


def test_without_the_option_nothing_is_recorded_and_no_thread_runs(model_dir):
    before = publisher_threads()
    for options in ({}, {"kv_events_config": {"enable_kv_cache_events": False}},
                    {"kv_events_config": {"enable_kv_cache_events": True, "publisher": "null"}}):
        llm = LLM(model=str(model_dir), dtype="float32", device="cpu", block_size=BLOCK, **options)
        llm.generate([[5, 9, 13, 200, 7, 42, 42, 42, 311]], GREEDY, use_tqdm=False)
        kv = llm.engine.kv_cache
        assert llm.engine.kv_events_publisher is None and kv.events is None and kv.prefix_cache.events is None
        assert len(kv.prefix_cache) > 0  # the cache itself works as ever
        assert publisher_threads() == before
        llm.shutdown()


# ---------------------------------------------------------------------------- the async Engine, over TCP

def test_the_async_engine_publishes_from_its_gpu_thread(model_dir):
    import anyio

    from aioinfer import Engine

    port = free_port()
    sub = Subscriber(f"tcp://127.0.0.1:{port}", topic="")

    async def main():
        async with Engine(str(model_dir), dtype="float32", device="cpu", block_size=BLOCK, num_kv_blocks=32,
                          kv_events_config=f'{{"enable_kv_cache_events": true, "endpoint": "tcp://*:{port}"}}'
                          ) as engine:
            prompt = list(range(10, 30))  # five full blocks
            deadline = time.monotonic() + 60
            # ZeroMQ's slow joiner: the first batches may go out before the subscription arrives; a new
            # prompt each round until one is heard
            while not sub.received:
                assert time.monotonic() < deadline
                async for _ in engine.generate(prompt, SamplingParams(temperature=0, max_tokens=2)):
                    pass
                sub.take(200)
                prompt = [t + 1 for t in prompt]

    try:
        anyio.run(main)
    finally:
        sub.close()
    seq, batch = sub.received[0]
    assert any(isinstance(e, BlockStored) and len(e.token_ids) == BLOCK * len(e.block_hashes)
               for e in batch.events)


def test_data_parallel_replicas_publish_on_their_own_endpoints(model_dir, tmp_path):
    """vLLM's convention: replica i on the endpoint + "_dp{i}" (a TCP port + i), its batches tagged i."""
    import anyio

    from aioinfer import DataParallelEngine

    endpoint = f"ipc://{tmp_path}/dp.sock"
    subs = [Subscriber(endpoint), Subscriber(endpoint + "_dp1")]

    async def main():
        async with DataParallelEngine(str(model_dir), data_parallel_size=2, dtype="float32", device="cpu",
                                      block_size=BLOCK, num_kv_blocks=64, kv_events_config={
                                          "enable_kv_cache_events": True, "endpoint": endpoint, "topic": TOPIC}
                                      ) as engine:
            assert [r._core.kv_events_publisher.endpoint for r in engine.replicas] == [endpoint, endpoint + "_dp1"]
            deadline, base = time.monotonic() + 60, 10
            while not all(sub.received for sub in subs):
                assert time.monotonic() < deadline

                async def one(prompt):
                    async for _ in engine.generate(prompt, SamplingParams(temperature=0, max_tokens=2)):
                        pass

                async with anyio.create_task_group() as tg:  # concurrent: the router spreads them
                    for i in range(4):
                        tg.start_soon(one, list(range(base + 20 * i, base + 20 * i + 12)))
                base += 100
                for sub in subs:
                    sub.take(100)

    try:
        anyio.run(main)
    finally:
        for sub in subs:
            sub.close()
    assert [sub.received[0][1].data_parallel_rank for sub in subs] == [0, 1]


# ---------------------------------------------------------------------------- wire forms and checks

def test_the_array_encoding_is_what_vllm_up_to_0_25_sent():
    """``"event_encoding": "array"``: each event a positional array led by its type, as vLLM's structs
    with array_like=True decode it (its subscriber example up to v0.25)."""
    from aioinfer.core.kv_events import CacheCleared, RemovedBlock, StoredBlock
    from aioinfer.engine.kv_events_publisher import EventBatcher

    records = [StoredBlock(-5, None, (1, 2), "tenant"), StoredBlock(6, -5, (3, 4), None),
               StoredBlock(9, 123, (5, 6), None), RemovedBlock(-5), RemovedBlock(6), CacheCleared()]
    encode = msgspec.msgpack.Encoder().encode
    raw = msgspec.msgpack.decode(encode(EventBatcher(2, 1, array_like=True).batch(1.5, records)))
    assert raw[0] == 1.5 and raw[2] == 1
    assert raw[1][0] == ["BlockStored", [U64 - 4, 6], None, [1, 2, 3, 4], 2, None, "GPU",
                         None, [["tenant"], None], 0, "full_attention"]
    old = msgspec.msgpack.Decoder(type=OldBatch).decode(encode(EventBatcher(2, 1, array_like=True).batch(1.5, records)))
    assert [type(e) for e in old.events] == [OldStored, OldStored, OldRemoved, OldCleared]
    assert old.events[2].block_hashes == [U64 - 4, 6]
    new = DECODER.decode(encode(EventBatcher(2, 0, array_like=False).batch(1.5, records)))
    assert [type(e) for e in new.events] == [BlockStored, BlockStored, BlockRemoved, AllBlocksCleared]
    assert new.events[0].extra_keys == [("tenant",), None] and new.events[1].parent_block_hash == 123
    assert msgspec.msgpack.decode(encode(new.events[0]))["type"] == "BlockStored"


def test_config_errors_name_the_key_and_the_extra(monkeypatch):
    import importlib.util

    from aioinfer.config import EngineConfig
    from aioinfer.engine.kv_events_publisher import offset_endpoint

    with pytest.raises(ValueError, match=r"kv_events_config has unknown keys \['port'\]"):
        EngineConfig.from_kwargs("m", kv_events_config='{"port": 1}')
    with pytest.raises(ValueError, match="kv_events_config.endpoint must be a ZeroMQ address"):
        EngineConfig.from_kwargs("m", kv_events_config={"endpoint": "localhost:5557"})
    assert EngineConfig.from_kwargs("m").kv_events is None
    defaults = EngineConfig.from_kwargs("m", kv_events_config="{}").kv_events
    assert (defaults.endpoint, defaults.topic, defaults.buffer_steps, defaults.hwm, defaults.max_queue_size,
            defaults.replay_endpoint, defaults.publisher, defaults.publishes) == (
        "tcp://*:5557", "", 10_000, 100_000, 100_000, None, "null", False)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "zmq" else real(name, *a))
    with pytest.raises(ValueError, match=r"needs pyzmq and msgspec \(zmq not installed\): pip install "
                                         r"'aioinfer\[kv-events\]'"):
        EngineConfig.from_kwargs("m", kv_events_config={"enable_kv_cache_events": True})
    EngineConfig.from_kwargs("m", kv_events_config={"enable_kv_cache_events": False})  # off: nothing needed
    assert offset_endpoint("tcp://*:5557", 2) == "tcp://*:5559" and offset_endpoint("ipc:///x", 1) == "ipc:///x_dp1"


def test_a_taken_port_fails_at_start_naming_the_key():
    from aioinfer.config import KVEventsConfig
    from aioinfer.engine.kv_events_publisher import KVEventPublisher

    holder = zmq.Context.instance().socket(zmq.PUB)
    port = holder.bind_to_random_port("tcp://*")
    try:
        with pytest.raises(ValueError, match=f"kv_events_config.endpoint: cannot open 'tcp://\\*:{port}'"):
            KVEventPublisher(KVEventsConfig(enable_kv_cache_events=True, endpoint=f"tcp://*:{port}"), 16)
    finally:
        holder.close(linger=0)
