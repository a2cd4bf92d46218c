"""vLLM's ``AsyncLLM`` shape over ``Engine``, so that scripts written against vLLM's async API run
with the import changed:

    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(model=..., enforce_eager=True))
    async for output in engine.generate(prompt, SamplingParams(output_kind=RequestOutputKind.DELTA),
                                        request_id="r1"):
        ...  # RequestOutput: cumulative, delta or final only, as ``output_kind`` says
    engine.shutdown()

vLLM's ``AsyncLLM`` is created outside the event loop and used without ``async with``. ``Engine``
lives inside a task group (structured concurrency), so the facade starts it, at the first call, in
a task of its own on the running loop that enters ``async with Engine(...)`` and waits for
``shutdown`` (or the loop's end, which cancels it: the engine then stops as on any exit). ``async
with AsyncLLM(...)`` works too and waits for the engine to stop. One request, one choice: ``n > 1``
is a ValueError, as with ``Engine.generate``.
"""

from __future__ import annotations

import asyncio
from contextlib import aclosing
from typing import Any, AsyncIterator, Optional

from aioinfer.engine_args import AsyncEngineArgs
from aioinfer.inputs import unwrap_prompt
from aioinfer.outputs import CompletionOutput, RequestOutput
from aioinfer.sampling_params import RequestOutputKind, SamplingParams


class AsyncLLM:
    def __init__(self, model: Optional[str] = None, **engine_kwargs: Any) -> None:
        from aioinfer.config import EngineConfig
        from aioinfer.fetch import DEFAULT_MODEL

        EngineConfig.from_kwargs(model or DEFAULT_MODEL, **engine_kwargs)  # bad options fail here, not at first use
        self._model, self._kwargs = model, engine_kwargs
        self._engine = None
        self._runner: Optional[asyncio.Task] = None
        self._started: Optional[asyncio.Future] = None
        self._stop: Optional[asyncio.Event] = None

    @classmethod
    def from_engine_args(cls, engine_args: AsyncEngineArgs, **_ignored: Any) -> "AsyncLLM":
        return cls(engine_args.model, **engine_args.engine_kwargs)

    async def engine(self):
        """The running ``Engine`` (started on the running loop at the first call)."""
        if self._runner is None:
            loop = asyncio.get_running_loop()
            self._started, self._stop = loop.create_future(), asyncio.Event()
            self._runner = loop.create_task(self._run(), name="aioinfer-async-llm")
        await asyncio.shield(self._started)
        return self._engine

    async def _run(self) -> None:
        from aioinfer.async_engine.engine import Engine

        try:
            async with Engine(self._model, **self._kwargs) as engine:
                self._engine = engine
                self._started.set_result(None)
                await self._stop.wait()
        except Exception as exc:
            if self._started.done():
                raise  # after the start: for __aexit__ (or the loop's exception handler)
            self._started.set_exception(exc)  # a load failure, for every caller waiting on the start
        finally:
            self._engine = None
            if not self._started.done():  # cancelled while loading
                self._started.set_exception(RuntimeError("the engine was stopped before it started"))

    async def generate(self, prompt, sampling_params: Optional[SamplingParams] = None, request_id: Optional[str] = None,
                       *, priority: int = 0, **_vllm_only: Any) -> AsyncIterator[RequestOutput]:
        """RequestOutputs of one request as it runs (``sampling_params.output_kind``: CUMULATIVE,
        DELTA or FINAL_ONLY). Leaving the iteration early aborts the request."""
        engine = await self.engine()
        params = sampling_params or SamplingParams()
        kind = params.output_kind
        text, token_ids, logprobs = "", [], None
        inner = unwrap_prompt(prompt)[0]
        prompt_text = inner if isinstance(inner, str) else None
        deltas = engine.generate(prompt, params, request_id=request_id, priority=priority,
                                 stream=kind != RequestOutputKind.FINAL_ONLY)
        prompt_ids: list[int] = []
        prompt_logprobs = None  # they come with the first token's delta
        async with aclosing(deltas):
            async for delta in deltas:
                prompt_ids = delta.prompt_token_ids or prompt_ids
                if kind == RequestOutputKind.DELTA:  # each output carries what is new, as vLLM's
                    text, token_ids, logprobs = delta.text, list(delta.token_ids), delta.logprobs
                    prompt_logprobs = delta.prompt_logprobs
                else:
                    text += delta.text
                    token_ids += delta.token_ids
                    if delta.logprobs is not None:
                        logprobs = (logprobs or []) + delta.logprobs
                    prompt_logprobs = delta.prompt_logprobs or prompt_logprobs
                output = CompletionOutput(index=0, text=text, token_ids=token_ids, logprobs=logprobs,
                                          finish_reason=delta.finish_reason, stop_reason=delta.stop_reason)
                yield RequestOutput(request_id=delta.request_id, prompt=prompt_text, prompt_token_ids=prompt_ids,
                                    outputs=[output], finished=delta.finished,
                                    num_cached_tokens=delta.num_cached_tokens, prompt_logprobs=prompt_logprobs)

    async def abort(self, request_id: str) -> None:
        if self._engine is not None:
            await self._engine.abort(request_id)

    async def get_tokenizer(self):
        return (await self.engine()).tokenizer

    def shutdown(self) -> None:
        """Stop the engine: its task leaves ``async with Engine`` when the loop next runs, or is
        cancelled at the loop's end (``asyncio.run``), which stops the engine's thread the same way."""
        if self._stop is not None:
            self._stop.set()

    async def __aenter__(self) -> "AsyncLLM":
        await self.engine()
        return self

    async def __aexit__(self, *exc_info) -> None:
        self.shutdown()
        if self._runner is not None:
            await self._runner
