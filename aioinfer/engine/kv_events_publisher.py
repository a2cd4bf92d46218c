"""Publishes the prefix cache's KV-cache events in vLLM's ZeroMQ format, from a thread of its own.

KV-aware routers (llm-d's precise prefix-cache scorer, NVIDIA Dynamo's KV router) subscribe to every
engine's events and index which engine holds which blocks; speaking vLLM's format lets them route to
aioinfer pods as they route to vLLM's. The engine core takes the recorded events once a step, on the
GPU thread (core/kv_events.py), and ``publish`` only puts them on a bounded queue: merging, encoding
and every socket call happen on this module's thread (ZeroMQ sockets are not thread-safe, and the
step loop must never wait on the network). A full queue drops the batch, which leaves a gap in the
sequence numbers, so that subscribers see the loss.

The wire format is vLLM's as of v0.26 (vllm/distributed/kv_events.py, with vllm-project/vllm#42892:
events as maps, and #45177: the topic in replay replies):

- PUB socket, one multipart message per batch: ``[topic, seq, payload]``; ``seq`` an 8-byte big-endian
  unsigned integer counting batches from 0.
- ``payload``: msgpack of ``EventBatch`` as a positional array ``[ts, events, data_parallel_rank]``
  (``ts``: float seconds since the epoch).
- each event a map tagged by its ``"type"``: ``BlockStored`` {block_hashes, parent_block_hash,
  token_ids, block_size, lora_id, medium, lora_name, extra_keys, group_idx, kv_cache_spec_kind},
  ``BlockRemoved`` {block_hashes, medium, group_idx}, ``AllBlocksCleared`` {}. vLLM's later optional
  fields (kv_cache_spec_sliding_window, locality) are left out, as vLLM omits them at their default.
  ``"event_encoding": "array"`` sends each event as the positional array vLLM <= 0.25 sent, its type
  first, then the fields in the order above.
- ROUTER replay socket: a request ``[b"", start_seq]`` (what a REQ or DEALER socket sends) gets each
  buffered batch from ``start_seq`` on as ``[b"", topic, seq, payload]``, then ``[b"", b"", -1, b""]``
  (``-1`` as 8 bytes, signed).

Block hashes are aioinfer's own chained keys (prefix_cache.py: Python's hash of the parent key and
the block's token ids), sent as unsigned 64-bit integers (the key modulo 2**64), as vLLM sends its
own. docs/kv_cache.md has the schema with a subscriber.
"""

from __future__ import annotations

import importlib
import itertools
import logging
import queue
import threading
import time
import weakref
from collections import deque
from typing import Optional

from aioinfer.config import KVEventsConfig
from aioinfer.core.kv_events import KVCacheEvent, RemovedBlock, StoredBlock, records

logger = logging.getLogger(__name__)

MEDIUM_GPU = "GPU"  # vLLM's name of the device tier
KV_CACHE_SPEC_KIND = "full_attention"  # vLLM's kind of an ordinary attention layer's KV (every model here)
END_SEQ = (-1).to_bytes(8, "big", signed=True)  # the replay's end marker
_U64 = (1 << 64) - 1
_INSTALL = "publishing KV-cache events needs pyzmq and msgspec: pip install 'aioinfer[kv-events]'"


def wire_types(array_like: bool):
    """vLLM's event structs: (EventBatch, BlockStored, BlockRemoved, AllBlocksCleared). The batch is a
    positional array either way; the events are maps tagged "type" (vLLM >= 0.26), or with
    ``array_like`` positional arrays led by their type (vLLM <= 0.25)."""
    import msgspec

    class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
        ts: float
        events: list
        data_parallel_rank: Optional[int] = None

    class BlockStored(msgspec.Struct, array_like=array_like, omit_defaults=True, gc=False, tag="BlockStored"):
        block_hashes: list[int]
        parent_block_hash: Optional[int]
        token_ids: list[int]
        block_size: int
        lora_id: Optional[int]
        medium: Optional[str]
        lora_name: Optional[str]
        extra_keys: Optional[list] = None  # per block: the keys besides its tokens its hash took (the salt), or None
        group_idx: Optional[int] = None
        kv_cache_spec_kind: Optional[str] = None

    class BlockRemoved(msgspec.Struct, array_like=array_like, omit_defaults=True, gc=False, tag="BlockRemoved"):
        block_hashes: list[int]
        medium: Optional[str]
        group_idx: Optional[int] = None

    class AllBlocksCleared(msgspec.Struct, array_like=array_like, omit_defaults=True, gc=False,
                           tag="AllBlocksCleared"):
        pass

    return EventBatch, BlockStored, BlockRemoved, AllBlocksCleared


def offset_endpoint(endpoint: Optional[str], data_parallel_rank: int) -> Optional[str]:
    """Replica ``data_parallel_rank``'s address, vLLM's convention: a TCP port plus the rank, an
    ipc:// or inproc:// name with ``_dp{rank}``; rank 0's is ``endpoint`` itself."""
    if not endpoint or data_parallel_rank == 0:
        return endpoint
    if endpoint.startswith(("ipc://", "inproc://")):
        return f"{endpoint}_dp{data_parallel_rank}"
    base, _, port = endpoint.rpartition(":")
    if not port.isdigit():
        raise ValueError(f"kv_events_config: {endpoint!r} needs a numeric port to give each data-parallel "
                         "replica its own (port + replica index)")
    return f"{base}:{int(port) + data_parallel_rank}"


def binds(endpoint: str) -> bool:
    """vLLM's rule: a wildcard address, an ipc:// or inproc:// one is bound; tcp://HOST:PORT is connected
    to (a subscriber that binds, a relay)."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


class EventBatcher:
    """Turns one batch of recorded events into vLLM's EventBatch (used on the publisher's thread)."""

    def __init__(self, block_size: int, data_parallel_rank: int, array_like: bool) -> None:
        self.block_size = block_size
        self.data_parallel_rank = data_parallel_rank
        self.types = wire_types(array_like)

    def batch(self, ts: float, records: list[KVCacheEvent]):
        """Consecutive stores of one chain (each block's parent the block before it) become one
        BlockStored, consecutive removals one BlockRemoved, as vLLM sends them."""
        EventBatch, Stored, Removed, Cleared = self.types
        events: list = []
        for record in records:
            last = events[-1] if events else None
            kind = type(record)
            if kind is StoredBlock:
                block_hash = record.block_hash & _U64
                parent = None if record.parent_hash is None else record.parent_hash & _U64
                if type(last) is Stored and parent is not None and last.block_hashes[-1] == parent:
                    last.block_hashes.append(block_hash)
                    last.token_ids.extend(record.token_ids)
                    last.extra_keys.append(None)
                    continue
                salt = None if record.cache_salt is None else (record.cache_salt,)
                events.append(Stored(block_hashes=[block_hash], parent_block_hash=parent,
                                     token_ids=list(record.token_ids), block_size=self.block_size, lora_id=None,
                                     medium=MEDIUM_GPU, lora_name=None, extra_keys=[salt], group_idx=0,
                                     kv_cache_spec_kind=KV_CACHE_SPEC_KIND))
            elif kind is RemovedBlock:
                if type(last) is Removed:
                    last.block_hashes.append(record.block_hash & _U64)
                else:
                    events.append(Removed(block_hashes=[record.block_hash & _U64], medium=MEDIUM_GPU, group_idx=0))
            else:
                events.append(Cleared())
        return EventBatch(ts=ts, events=events, data_parallel_rank=self.data_parallel_rank)


class KVEventPublisher:
    """One engine's publisher: ``publish`` on the GPU thread; the sockets on ``thread``, which holds no
    reference to the publisher, so that an engine dropped without ``shutdown`` still stops it."""

    SHUTDOWN_TIMEOUT = 2.0  # seconds shutdown waits for queued batches to be sent

    def __init__(self, config: KVEventsConfig, block_size: int, data_parallel_rank: int = 0) -> None:
        for module in ("zmq", "msgspec"):  # the config checked they are there; say what to do if not
            try:
                importlib.import_module(module)
            except ImportError as exc:
                raise ImportError(f"{_INSTALL} ({exc})") from None
        self.config = config
        self.endpoint = offset_endpoint(config.endpoint, data_parallel_rank)
        self.replay_endpoint = offset_endpoint(config.replay_endpoint, data_parallel_rank)
        self._queue: queue.Queue = queue.Queue(maxsize=config.max_queue_size)
        self._seq = itertools.count()
        self.num_batches = 0  # batches published so far: the next one's seq
        self.num_dropped = 0  # of them, dropped for a full queue (their seq numbers are missing)
        self._closed = False
        started: list = []  # the thread's answer: None (listening) or the error that stopped it
        ready = threading.Event()
        batcher = EventBatcher(block_size, data_parallel_rank, array_like=config.event_encoding == "array")
        self.thread = threading.Thread(target=_serve, name="aioinfer-kv-events", daemon=True,
                                       args=(self._queue, config, self.endpoint, self.replay_endpoint, batcher,
                                             started, ready))
        self.thread.start()
        ready.wait()
        if started[0] is not None:
            self.thread.join()
            raise started[0]
        self._finalizer = weakref.finalize(self, _stop, self._queue)

    # ------------------------------------------------------------------ the GPU thread's side

    def publish(self, events: list) -> None:
        """Queue one batch (non-empty: ``KVEventRecorder.take``'s raw events); never blocks. A full queue
        drops it, leaving its seq unused."""
        if self._closed:
            return
        seq = next(self._seq)
        self.num_batches = seq + 1
        try:
            self._queue.put_nowait((seq, time.time(), events))
        except queue.Full:
            self.num_dropped += 1
            if self.num_dropped & (self.num_dropped - 1) == 0:  # the 1st, 2nd, 4th, ... drop
                logger.warning("KV-cache events: the publisher's queue is full (max_queue_size %d); batch %d "
                               "dropped, %d in all", self.config.max_queue_size, seq, self.num_dropped)

    def shutdown(self) -> None:
        """Send what is queued (within SHUTDOWN_TIMEOUT), close the sockets, end the thread. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._finalizer.detach()
        try:
            self._queue.put(None, timeout=self.SHUTDOWN_TIMEOUT)
        except queue.Full:
            logger.warning("KV-cache events: %d batches still queued at shutdown", self._queue.qsize())
        self.thread.join(timeout=self.SHUTDOWN_TIMEOUT)


def _stop(events: queue.Queue) -> None:
    """A publisher dropped without ``shutdown``: its thread sends what is queued and ends."""
    try:
        events.put_nowait(None)
    except queue.Full:
        pass


# ---------------------------------------------------------------------------- the publisher's thread

def _serve(events: queue.Queue, config: KVEventsConfig, endpoint: str, replay_endpoint: Optional[str],
           batcher: EventBatcher, started: list, ready: threading.Event) -> None:
    import msgspec
    import zmq

    ctx = zmq.Context.instance()  # shared, so that inproc:// subscribers of this process can connect
    pub = replay = None
    opening = ("endpoint", endpoint)
    try:
        pub = ctx.socket(zmq.PUB)
        pub.set_hwm(config.hwm)
        (pub.bind if binds(endpoint) else pub.connect)(endpoint)
        if replay_endpoint is not None:
            opening = ("replay_endpoint", replay_endpoint)
            replay = ctx.socket(zmq.ROUTER)
            replay.bind(replay_endpoint)
    except Exception as exc:  # noqa: BLE001 - raised in the engine's constructor
        for socket in (pub, replay):
            if socket is not None:
                socket.close(linger=0)
        started.append(ValueError(f"kv_events_config.{opening[0]}: cannot open {opening[1]!r}: {exc}"))
        ready.set()
        return
    started.append(None)
    ready.set()
    encode = msgspec.msgpack.Encoder().encode
    topic = config.topic.encode()
    buffer: deque[tuple[bytes, bytes]] = deque(maxlen=config.buffer_steps)
    try:
        while True:
            while replay is not None and replay.poll(0):
                _serve_replay(replay, topic, buffer)
            try:
                # With a replay socket, wake often enough to answer requests while no events come.
                item = events.get(timeout=0.02 if replay is not None else 0.5)
            except queue.Empty:
                continue
            if item is None:
                break
            seq, ts, raw = item
            try:
                payload = encode(batcher.batch(ts, records(raw)))
                seq_bytes = seq.to_bytes(8, "big")
                pub.send_multipart((topic, seq_bytes, payload))
                if buffer.maxlen:
                    buffer.append((seq_bytes, payload))
            except Exception:  # noqa: BLE001 - one bad batch must not end the stream
                logger.exception("KV-cache events: batch %d could not be sent", seq)
    finally:
        pub.close(linger=1000)  # a second for the last batches to leave
        if replay is not None:
            replay.close(linger=0)


def _serve_replay(replay, topic: bytes, buffer: deque) -> None:
    frames = replay.recv_multipart()
    if len(frames) != 3 or len(frames[2]) != 8:
        logger.warning("KV-cache events: malformed replay request (%d frames)", len(frames))
        return
    client, delimiter, start = frames
    for seq_bytes, payload in buffer:
        if seq_bytes >= start:  # equal-length big-endian unsigned: byte order is number order
            replay.send_multipart((client, delimiter, topic, seq_bytes, payload))
    replay.send_multipart((client, delimiter, b"", END_SEQ, b""))
