"""One replica of a data-parallel engine: an ordinary ``Engine`` on its own device and GPU thread.

Composition, not a copy: the replica is an ``Engine`` whose core is built by ``load_for_engine``
(which makes the replica's device current on its GPU thread) with a tokenizer shared by all
replicas, and whose observers see its index on every record.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from typing import Any, Callable, Optional

from aioinfer.async_engine.engine import Engine
from aioinfer.async_engine.stats import RequestStats, StepStats

logger = logging.getLogger(__name__)


class SharedTokenizer:
    """Loads the tokenizer once for all replicas (a GGUF's tokenizer takes seconds to rebuild).

    Called from the replicas' GPU threads, hence the lock; the tokenizer itself is then used on the
    event loop only (each replica's input and output processors), never from two threads at once.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loaded = False
        self._tokenizer: Any = None

    def load(self, source, tokenizer_path: Optional[str]):
        from aioinfer.text.tokenizer import load_tokenizer

        with self._lock:
            if not self._loaded:
                self._tokenizer = load_tokenizer(source, tokenizer_path)
                self._loaded = True
            return self._tokenizer


class ReplicaEngine(Engine):
    """``Engine`` number ``index`` of a ``DataParallelEngine``; ``engine_kwargs`` name its device."""

    def __init__(self, index: int, tokenizer: SharedTokenizer, **engine_kwargs: Any) -> None:
        super().__init__(**engine_kwargs)
        self.index = index
        self._shared_tokenizer = tokenizer

    def _make_core(self):  # on this replica's GPU thread
        from aioinfer.engine.engine_core import EngineCore
        from aioinfer.executor.model_setup import load_for_engine

        if self.config.parallel.tensor_parallel_size > 1:
            # Its tensor-parallel runner loads the shards (on this replica's device and the GPUs after
            # it) and the tokenizer itself; tokenizer sharing is for whole-model replicas only.
            return EngineCore(self.config, data_parallel_rank=self.index)
        loaded = load_for_engine(self.config, tokenizer_loader=self._shared_tokenizer.load)
        # the rank: KV-cache events of replica i go out on the endpoint's port + i, tagged with i
        return EngineCore(self.config, loaded, data_parallel_rank=self.index)


class IndexedObserver:
    """Forwards one replica's records to a user observer with ``engine_index`` set."""

    def __init__(self, index: int, target) -> None:
        self.index = index
        self.target = target

    def on_step(self, stats: StepStats) -> None:
        self.target.on_step(dataclasses.replace(stats, engine_index=self.index) if self.index else stats)

    def on_request_done(self, stats: RequestStats) -> None:
        self.target.on_request_done(dataclasses.replace(stats, engine_index=self.index) if self.index else stats)

    def on_rejected(self, reason: str) -> None:
        self.target.on_rejected(reason)


class RequestEndTracker:
    """Tells the data-parallel engine when a replica's request ended, whatever ended it: the
    replica reports every request exactly once (finished, aborted, failed, shut down)."""

    def __init__(self, index: int, on_end: Callable[[int, str], None]) -> None:
        self.index = index
        self._on_end = on_end

    def on_step(self, stats: StepStats) -> None:
        pass

    def on_request_done(self, stats: RequestStats) -> None:
        self._on_end(self.index, stats.request_id)

    def on_rejected(self, reason: str) -> None:
        pass
