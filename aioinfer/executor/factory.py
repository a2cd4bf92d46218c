"""Which executor an engine gets: the local one, or the tensor-parallel one when the config asks
for more than one rank. Kept apart from abstract.py so that the interface never imports its
implementations (they import it)."""

from __future__ import annotations

from aioinfer.config import EngineConfig
from aioinfer.executor.abstract import Executor
from aioinfer.executor.local import LocalExecutor
from aioinfer.executor.model_setup import LoadedModel
from aioinfer.executor.tensor_parallel import TensorParallelExecutor


def create_executor(config: EngineConfig, loaded: LoadedModel | None = None) -> Executor:
    """The executor for ``config``. ``loaded``: a model already loaded on this thread (data-parallel
    replicas load their own); only the local executor can take one, every rank loads its own shard."""
    if config.parallel.tensor_parallel_size > 1:
        if loaded is not None:
            raise ValueError("a preloaded model cannot be used with tensor_parallel_size > 1")
        # Rank 0 of a tensor-parallel group: the executor spawns the other ranks and loads this shard.
        return TensorParallelExecutor(config)
    return LocalExecutor(config, loaded)
