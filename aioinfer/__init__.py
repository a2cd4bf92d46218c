"""aioinfer: an asyncio-native LLM inference engine for Qwen2.5 and Llama models."""

from aioinfer.outputs import CompletionOutput, Logprob, RequestOutput
from aioinfer.sampling_params import RequestOutputKind, SamplingParams

from aioinfer.version import __version__

__all__ = ["LLM", "Engine", "DataParallelEngine", "create_engine", "SamplingParams", "RequestOutput",
           "CompletionOutput", "Logprob", "RequestOutputKind", "AsyncLLM", "AsyncEngineArgs", "EngineArgs",
           "__version__"]


def __getattr__(name: str):
    # Imported lazily so that `import aioinfer` (and the pure-Python scheduler) does not pull in torch.
    if name == "LLM":
        from aioinfer.entrypoints.llm import LLM

        return LLM
    if name == "Engine":
        from aioinfer.async_engine.engine import Engine

        return Engine
    if name == "AsyncLLM":
        from aioinfer.async_llm import AsyncLLM

        return AsyncLLM
    if name in ("EngineArgs", "AsyncEngineArgs"):
        from aioinfer import engine_args

        return getattr(engine_args, name)
    if name in ("DataParallelEngine", "create_engine"):
        from aioinfer.data_parallel import engine as data_parallel

        return getattr(data_parallel, name)
    raise AttributeError(f"module 'aioinfer' has no attribute {name!r}")
