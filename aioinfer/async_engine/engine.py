"""The embeddable async engine: ``async with Engine(...) as engine`` inside any anyio application.

Structure (docs/design.md's data flow): the step loop runs on one dedicated GPU thread; this object's
task group owns it (a task awaits the thread's end, so it is joined on exit). Requests reach the
thread through its inbox; each step's results come back through a ``LoopBridge`` (queued, run on
the loop in order, the GPU thread waiting only when several steps are unprocessed) into
``_on_step_result``, which detokenizes and hands every request its delta through a bounded
per-request stream (``RequestChannel``; its consumer, what ``generate`` returns, is
``request_channel.iterate_deltas``). The GPU thread never waits for a consumer.

Everything on the loop is paid per token for every stream (and, under data parallelism, for every
replica's streams on one loop), so the per-token path avoids what it can: one clock read per step,
no per-token dicts, a consumer that waits on a plain event instead of the stream's ``receive()``,
and, for ``stream=False``, no consumer wake-up at all until the request ends.
"""

from __future__ import annotations

import itertools
import logging
import time
import uuid
from typing import Any, AsyncIterator, Callable, Optional, Sequence, Union

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread

from aioinfer.async_engine.host_cpu import check_host_cpu, pin_loop_thread, unpin_loop_thread
from aioinfer.async_engine.admission import AdmissionQueue
from aioinfer.async_engine.loop_bridge import LoopBridge
from aioinfer.async_engine.request_channel import RequestChannel, event_factory, iterate_deltas
from aioinfer.async_engine.stats import EngineObserver, StepStats, call_observer, request_stats
from aioinfer.async_engine.step_loop import AddRequest, FinishRequests, StepLoop, StepResult, Stop
from aioinfer.config import EngineConfig
from aioinfer.engine.delta import GenerationDelta
from aioinfer.engine.input_processor import InputProcessor, prompt_salt
from aioinfer.engine.output_processor import OutputProcessor
from aioinfer.errors import (AdmissionLimitExceeded, EngineDeadError, EngineNotReady, EngineOverloaded,
                             SlowConsumerError)
from aioinfer.layers.quantization.fp8_linear import quantization_method
from aioinfer.request import RequestStatus
from aioinfer.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

Prompt = Union[str, Sequence[int], dict]  # a string, token ids, or vLLM's TextPrompt / TokensPrompt
_WATCHDOG_PERIOD = 0.25  # seconds between slow-consumer checks


class Engine:
    """Async LLM engine. Keyword arguments beyond the ones below are the offline ``LLM``'s options."""

    def __init__(
        self,
        model: Optional[str] = None,
        *,
        max_waiting_requests: int = 512,  # admitted requests not yet scheduled
        max_waiting_prompt_tokens: int = 262_144,  # their prompt tokens
        stream_buffer_size: int = 64,  # deltas buffered per request before merging
        stream_interval: int = 1,  # tokens per streamed delta (the first and the last at once; vLLM's option)
        stall_timeout: float = 30.0,  # seconds a consumer may leave delivered deltas untaken
        host_cpu: Optional[int] = None,  # run the event loop's thread and the GPU thread on this CPU (host_cpu.py)
        observers: Sequence[EngineObserver] = (),
        fault_inject_step: Optional[int] = None,  # tests: make the step loop fail at this step
        **engine_kwargs: Any,
    ) -> None:
        from aioinfer.fetch import DEFAULT_MODEL

        for name, value in (("max_waiting_requests", max_waiting_requests), ("stream_buffer_size", stream_buffer_size),
                            ("max_waiting_prompt_tokens", max_waiting_prompt_tokens), ("stream_interval", stream_interval)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not stall_timeout > 0:
            raise ValueError(f"stall_timeout must be > 0, got {stall_timeout!r}")
        check_host_cpu(host_cpu)
        self.config = EngineConfig.from_kwargs(model or DEFAULT_MODEL, **engine_kwargs)
        if self.config.parallel.data_parallel_size > 1:
            raise ValueError("data_parallel_size > 1 needs aioinfer.DataParallelEngine (or aioinfer.create_engine), "
                             "which runs one Engine per replica")
        self.max_waiting_requests = max_waiting_requests
        self.max_waiting_prompt_tokens = max_waiting_prompt_tokens
        self.stream_buffer_size = stream_buffer_size
        self.stream_interval = stream_interval
        self.stall_timeout = stall_timeout
        self.host_cpu = host_cpu
        self._pinned_loop_thread = False  # host_cpu: this engine pinned the event loop's thread
        self.observers = list(observers)
        self._fault_inject_step = fault_inject_step

        self._core = None  # the EngineCore; built and used on the GPU thread only
        self._loop: Optional[StepLoop] = None
        self._bridge: Optional[LoopBridge] = None
        self._task_group: Optional[anyio.abc.TaskGroup] = None
        self._channels: dict[str, RequestChannel] = {}
        self._outputs: Optional[OutputProcessor] = None
        self._inputs: Optional[InputProcessor] = None
        self._ids = itertools.count()
        self._admission = AdmissionQueue(max_waiting_requests, max_waiting_prompt_tokens)
        self._accepting = False
        self._dead: Optional[BaseException] = None
        self._ready = False
        self._warmed_up = False  # observers hear of steps and requests only after the warm-up
        self._last_step: Optional[StepStats] = None
        self._new_event = anyio.Event  # one-shot wake-up events; the running backend's cheapest (__aenter__)
        self.counters = {"aborted_slow_consumer": 0, "rejected_overloaded": 0, "finished": 0, "aborted": 0}

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> "Engine":
        token = anyio.lowlevel.current_token()
        self._new_event = event_factory()
        loaded = anyio.Event()
        load_result: list = []

        def on_loaded(core, error) -> None:  # GPU thread
            load_result.extend([core, error])
            anyio.from_thread.run_sync(loaded.set, token=token)

        self._bridge = bridge = LoopBridge(token, on_error=self._on_delivery_error)

        def report_dead(exc: BaseException) -> None:  # GPU thread
            # After every result queued before it; directly if the bridge itself is what broke.
            if not bridge.call(self._on_dead, exc):
                anyio.from_thread.run_sync(self._on_dead, exc, token=token)

        self._loop = StepLoop(
            make_core=self._make_core,
            deliver=lambda result: bridge.call(self._on_step_result, result),
            on_loaded=on_loaded,
            on_dead=report_dead,
            fault_inject_step=self._fault_inject_step,
            host_cpu=self.host_cpu,
        )
        self._task_group = anyio.create_task_group()
        await self._task_group.__aenter__()
        try:
            self._task_group.start_soon(self._own_thread, name="aioinfer-gpu-thread-owner")
            await loaded.wait()
            core, error = load_result
            if error is not None:
                raise error
            self._core = core
            loaded_model = core.loaded
            self._inputs = InputProcessor(loaded_model.tokenizer, loaded_model.arch.vocab_size,
                                          loaded_model.max_model_len, loaded_model.eos_token_ids,
                                          seed=self.config.model.seed, max_logprobs=self.config.model.max_logprobs,
                                          grammar_limits=core.grammar_limits)
            self._outputs = OutputProcessor(loaded_model.tokenizer)
            if self.host_cpu is not None and not self._pinned_loop_thread:
                pin_loop_thread(self.host_cpu)  # the GPU thread pinned itself once the model had loaded
                self._pinned_loop_thread = True
            self._accepting = True
            self._task_group.start_soon(self._watchdog, name="aioinfer-slow-consumer-watchdog")
            warm_up_started = time.perf_counter()
            await self._warm_up()
            logger.info("warm-up step: done in %.2f s", time.perf_counter() - warm_up_started)
        except BaseException:
            await self._shutdown()
            await self._task_group.__aexit__(None, None, None)
            self._bridge.close()
            self._unpin_loop_thread()
            raise
        return self

    async def __aexit__(self, *exc_info) -> Optional[bool]:
        await self._shutdown()
        try:
            return await self._task_group.__aexit__(*exc_info)
        finally:
            self._bridge.close()  # the GPU thread has ended: nothing more to hand over
            self._unpin_loop_thread()

    def _unpin_loop_thread(self) -> None:
        """The event loop's thread is the caller's: it gets its CPUs back when the engine ends."""
        if self._pinned_loop_thread:
            unpin_loop_thread()
            self._pinned_loop_thread = False

    def _make_core(self):
        from aioinfer.engine.engine_core import EngineCore

        return EngineCore(self.config)

    async def _own_thread(self) -> None:
        self._loop.start()
        # The thread only ends after Stop (or a failure); shielded so that cancelling the task group
        # cannot leave it running unowned.
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(self._loop.thread.join)

    async def _shutdown(self) -> None:
        self._accepting = False
        self._ready = False
        for channel in list(self._channels.values()):
            self._abort_channel(channel, "shutdown")
        if self._loop is not None:
            self._loop.submit(Stop())
        self._task_group.cancel_scope.cancel()  # stops the watchdog; the thread owner is shielded

    async def _warm_up(self) -> None:
        """One real generation step, so that /ready means a step has succeeded."""
        warm = self.generate([self._warm_up_token()], SamplingParams(max_tokens=1, ignore_eos=True),
                             request_id="aioinfer-warm-up")
        async for _ in warm:
            pass
        self._warmed_up = True
        self._ready = True

    def _warm_up_token(self) -> int:
        arch = self._core.loaded.arch
        return arch.bos_token_id if isinstance(arch.bos_token_id, int) else 0

    # ------------------------------------------------------------------ public API

    @property
    def is_ready(self) -> bool:
        return self._ready and self._dead is None

    @property
    def is_dead(self) -> bool:
        return self._dead is not None

    @property
    def tokenizer(self):
        return self._core.loaded.tokenizer if self._core is not None else None

    @property
    def max_model_len(self) -> int:
        return self._core.loaded.max_model_len

    @property
    def quantization(self) -> Optional[str]:
        return quantization_method(self._core.loaded.model)  # vLLM's name ("fp8", ...), None when plain

    @property
    def vocab_size(self) -> int:
        return self._core.loaded.arch.vocab_size

    @property
    def max_logprobs(self) -> int:
        """The most logprobs a request may ask for a position (``ModelConfig.max_logprobs``; -1: the vocabulary)."""
        return self.config.model.max_logprobs

    @property
    def generation_defaults(self) -> dict:
        """The model's generation_config.json values (requests that leave a field out take these)."""
        return self._core.loaded.generation_defaults if self._core is not None else {}

    @property
    def model_name(self) -> str:
        from aioinfer.fetch import DEFAULT_MODEL_ALIASES, DEFAULT_MODEL

        name = self.config.model.model
        if name in DEFAULT_MODEL_ALIASES:
            return DEFAULT_MODEL
        return name.rstrip("/").rsplit("/", 1)[-1]

    def tokenize(self, prompt: Prompt) -> list[int]:
        self._check_open()
        return self._inputs.tokenize(prompt)[1]

    async def prepare_structured_output(self, params, count: int = 1) -> None:
        """Build the matchers of ``count`` requests with a ``StructuredOutputsParams`` in a worker
        thread, so that ``generate`` with it does not build them on the event loop (it would, for
        0.4 ms to a few ms each, without this call). Raises ``InvalidGrammarError`` (a ValueError)
        for a schema or grammar that does not compile."""
        self._check_open()
        # Abandoned on cancellation (the client left): the compile cannot be stopped, but its work is
        # bounded (structured_output/limits.py) and its handler need not wait for it.
        await anyio.to_thread.run_sync(self._inputs.grammars.prepare, params, count, abandon_on_cancel=True)

    def generate(
        self,
        prompt: Prompt,
        sampling_params: Optional[SamplingParams] = None,
        *,
        request_id: Optional[str] = None,
        priority: int = 0,  # lower runs first (FCFS within a priority, aged: see core/request_queue.py)
        deadline: Optional[float] = None,  # anyio clock time (anyio.current_time()) after which it is aborted
        cache_salt: Optional[str] = None,  # prefix-cache isolation: only requests with equal salts share blocks
        stream: bool = True,  # False: one merged delta when the request ends (vLLM's FINAL_ONLY)
        stall_probe: Optional[Callable[[float], Optional[float]]] = None,  # a relay's recipient: see below
    ) -> AsyncIterator[GenerationDelta]:
        """Validate and admit a request now; returns the async iterator of its deltas.

        A consumer that takes nothing for ``stall_timeout`` seconds while deltas wait for it is
        aborted (``SlowConsumerError``). A consumer that relays the deltas (an HTTP response) may
        pass ``stall_probe(now)``: since when (``time.monotonic()``) its own recipient has taken
        nothing while data waited for it, or None while it keeps up; the same limit applies to it,
        and the probe's ``on_stalled()``, if it has one, is called when the request is aborted so.

        With ``stream=False`` the iterator yields exactly one delta, the merge of every delta a
        streaming request would have yielded (or raises the error / ends with the abort as then);
        its consumer is not woken before that, which is what a non-streaming HTTP response wants.

        Raises at once: ValueError (bad input, too long), EngineOverloaded, EngineDeadError, EngineNotReady.
        Leaving the iteration early (break, cancellation, deadline) aborts the request.
        """
        self._check_open()
        params = sampling_params.clone() if sampling_params is not None else SamplingParams()
        if params.n != 1:
            raise ValueError("n must be 1 for Engine.generate; issue n calls (seed + i) for several samples")
        request_id = checked_request_id(request_id, self._channels)
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise ValueError(f"priority must be an integer, got {priority!r}")
        text, prompt_ids = self._inputs.tokenize(prompt)
        request = self._inputs.make_request(request_id, prompt_ids, params, priority=priority,
                                            cache_salt=prompt_salt(prompt, cache_salt))
        self._core.scheduler.check_fits(request.num_prompt_tokens, request.max_tokens)  # immutable limits
        self._admit(len(prompt_ids))
        channel = RequestChannel.open(request_id, len(prompt_ids), self.stream_buffer_size, final_only=not stream,
                                      interval=self.stream_interval,
                                      stall_probe=stall_probe)
        self._channels[request_id] = channel
        self._admission.enter(len(prompt_ids))
        self._outputs.add_request(request_id, text, prompt_ids, params)
        self._loop.submit(AddRequest(request))
        return iterate_deltas(channel, deadline, self._new_event, self._abort_channel)

    async def abort(self, request_id: str, *, cause: str = "api") -> None:
        """Abort a queued or running request; its consumer receives a final delta with finish_reason "abort".
        ``cause`` is what metrics and request logs record (e.g. "shutdown" from a server going down)."""
        channel = self._channels.get(request_id)
        if channel is not None:
            self._abort_channel(channel, cause)

    def stats(self) -> dict:
        step = self._last_step
        return {
            "ready": self.is_ready,
            "dead": self.is_dead,
            "open_requests": len(self._channels),
            "waiting_admission": self._admission.requests,
            "waiting_admission_tokens": self._admission.prompt_tokens,
            "num_running": step.num_running if step else 0,
            "num_waiting": step.num_waiting if step else 0,
            "kv_usage": step.kv_usage if step else 0.0,
            **self.counters,
            **({"cache_config": self._core.cache_config_info} if self._core is not None else {}),  # vLLM's labels
        }

    # ------------------------------------------------------------------ event-loop side of the bridge

    def _on_step_result(self, result: StepResult) -> None:
        for request_id, error in result.rejected:
            channel = self._channels.get(request_id)
            if channel is not None:
                self._end_channel(channel, "error", error=error)
        for request_id in result.started:
            channel = self._channels.get(request_id)
            if channel is not None and channel.scheduled_at is None:
                channel.scheduled_at = result.step_start
                self._leave_admission(channel, result.step_start)
        outputs = result.outputs
        deltas, stopped_by_string = self._outputs.process(outputs)
        if stopped_by_string:
            self._loop.submit(FinishRequests(tuple(stopped_by_string), RequestStatus.FINISHED_STOPPED))
        channels = self._channels
        for out in outputs:
            if out.num_preemptions:  # cumulative per request; rare, so no per-token lookup otherwise
                channel = channels.get(out.request_id)
                if channel is not None:
                    channel.num_preemptions = out.num_preemptions
        now = time.monotonic()  # one clock read for the step: every delta in it arrived together
        for delta in deltas:
            channel = channels.get(delta.request_id)
            if channel is None:
                continue
            channel.deliver(delta, now)
            if delta.finish_reason is not None:
                self._end_channel(channel, "finished", finish_reason=delta.finish_reason)
        if result.stats is not None:
            self._last_step = result.stats
            if self._warmed_up:  # the warm-up step is the engine's own, not served work: metrics skip it
                for observer in self.observers:
                    call_observer(observer.on_step, result.stats)

    def _on_delivery_error(self, error: BaseException) -> None:
        """A step's results could not be delivered: requests may have lost tokens, so the engine is dead."""
        if self._dead is None:
            self._on_dead(error)
            self._loop.submit(Stop())

    def _on_dead(self, error: BaseException) -> None:
        self._dead = error
        self._accepting = False
        self._ready = False
        self._last_step = None  # nothing runs or waits any more: stats() and the gauges read 0
        dead = EngineDeadError(f"the engine's step loop failed: {error!r}")
        dead.__cause__ = error
        for channel in list(self._channels.values()):
            self._end_channel(channel, "error", error=dead)

    async def _watchdog(self) -> None:
        period = min(_WATCHDOG_PERIOD, self.stall_timeout / 2)
        while True:
            await anyio.sleep(period)
            now = time.monotonic()
            for channel in list(self._channels.values()):
                if channel.stalled_for(now) > self.stall_timeout:  # a failing probe reads as "keeping up"
                    self.counters["aborted_slow_consumer"] += 1
                    self._abort_channel(channel, "slow_consumer", error=SlowConsumerError(
                        f"request {channel.request_id}: the consumer took nothing for {self.stall_timeout:g} s "
                        f"while output waited for it"))
                    # A relay may cut its recipient off (an HTTP response closes the connection).
                    on_stalled = getattr(channel.stall_probe, "on_stalled", None)
                    if on_stalled is not None:
                        call_observer(on_stalled)  # never raises into the engine

    # ------------------------------------------------------------------ helpers

    def _check_open(self) -> None:
        if self._dead is not None:
            raise EngineDeadError(f"the engine is dead: {self._dead!r}")
        if not self._accepting:
            raise EngineNotReady("the engine is not running (not started yet, or shutting down)")

    @property
    def admission(self) -> AdmissionQueue:
        """The admission queue's counts and bounds (read-only use: a data-parallel router checks rooms)."""
        return self._admission

    def has_room(self, num_prompt_tokens: int) -> bool:
        """Whether ``generate`` would admit a prompt of this many tokens now (False: EngineOverloaded)."""
        return self._admission.has_room(1, num_prompt_tokens)

    def check_admission(self, prompt_lengths: Sequence[int]) -> None:
        """Check that requests with these prompt lengths could all be admitted now, admitting none:
        an HTTP request's whole fan-out (prompts x n) is checked before any part of it runs.

        Raises ``AdmissionLimitExceeded`` (a ValueError) when they exceed the bounds even with an
        empty queue, ``EngineOverloaded`` (with a drain-rate ``retry_after``) when the queue is full now.
        """
        self._check_open()
        try:
            self._admission.check(prompt_lengths)
        except EngineOverloaded:
            self._count_rejected("overloaded")
            raise
        except AdmissionLimitExceeded:
            self._count_rejected("invalid")
            raise

    def _admit(self, num_prompt_tokens: int) -> None:
        self.check_admission((num_prompt_tokens,))

    def _count_rejected(self, reason: str) -> None:
        if reason == "overloaded":
            self.counters["rejected_overloaded"] += 1
        for observer in self.observers:
            call_observer(observer.on_rejected, reason)

    def _leave_admission(self, channel: RequestChannel, now: float) -> None:
        if channel.waiting_admission:
            channel.waiting_admission = False
            self._admission.leave(channel.num_prompt_tokens, now)

    def _abort_channel(self, channel: RequestChannel, cause: str, error: Optional[BaseException] = None,
                       notify: bool = True) -> None:
        """Abort a request from the event loop: the GPU thread frees its blocks at the next step boundary."""
        if channel.request_id not in self._channels:
            return
        channel.abort_cause = cause
        if self._loop is not None and self._dead is None:
            self._loop.submit(FinishRequests((channel.request_id,)))
        final = self._outputs.abort(channel.request_id) if notify and error is None else None
        if final is not None:
            channel.deliver(final, time.monotonic())
        self._end_channel(channel, "aborted", finish_reason="abort", error=error)

    def _end_channel(self, channel: RequestChannel, status: str, finish_reason: Optional[str] = None,
                     error: Optional[BaseException] = None) -> None:
        if self._channels.pop(channel.request_id, None) is None:
            return
        now = time.monotonic()
        self._leave_admission(channel, now)
        self._outputs.pop(channel.request_id)
        if error is not None:
            channel.fail(error)
        elif not channel.closed:
            channel.fail(EngineDeadError("the request ended without a final result"))
        if not self._warmed_up:
            return  # the warm-up request (the only one before it is done) is not served work: not counted
        self.counters["finished" if status == "finished" else "aborted"] += 1
        stats = request_stats(channel, status, finish_reason, now)
        for observer in self.observers:
            call_observer(observer.on_request_done, stats)


def checked_request_id(request_id: Optional[str], in_use) -> str:
    """The caller's request id, validated and not in ``in_use``; a fresh one when None."""
    if request_id is None:
        return f"req-{uuid.uuid4().hex}"
    if not isinstance(request_id, str) or not request_id:
        raise ValueError("request_id must be a non-empty string")
    if request_id in in_use:
        raise ValueError(f"request id {request_id!r} is already in use")
    return request_id
