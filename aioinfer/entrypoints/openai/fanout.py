"""One HTTP request = several engine requests (prompts x n); their deltas merged by choice index.

A non-streaming HTTP request admits its engine requests with ``stream=False``: the engine wakes
its consumer once, with the whole merged output, instead of once per step (the response is built
from that one delta per choice, exactly as from the merged stream).

Every engine request is admitted up front, synchronously, so that a bad prompt or a full queue
fails the whole HTTP request before anything is streamed and before any choice runs alone. The
admission bounds are checked for the whole fan-out before the first choice is admitted: a request
too large for them costs the engine nothing, whether it is refused for now (429) or for ever (400).
An engine whose replicas live in other processes (aioinfer/ray) answers admission with each
stream's first item instead: ``confirmed()`` awaits those answers before anything is sent.

Ownership: each engine stream is iterated and closed by exactly one task (the consumer itself
when there is one stream, else one pump task per stream), because the engine's iterator may hold
cancel scopes that must stay in the task that entered them. Whatever way the consumer leaves
(finished, error, client disconnect = cancellation, the response never started), every engine
request ends up closed and aborted; aborting a finished request is harmless.
"""

from __future__ import annotations

import asyncio
import weakref
from dataclasses import dataclass
from typing import AsyncIterator, Optional, Sequence, Union

from aioinfer.engine.delta import GenerationDelta
from aioinfer.sampling_params import SamplingParams

Prompt = Union[str, list[int]]


@dataclass(frozen=True, slots=True)
class ChoiceSpec:
    index: int  # the choice's index in the response
    prompt_index: int  # which prompt of the request it answers
    prompt: Prompt  # text, or token ids (already templated for chat)
    params: SamplingParams  # n == 1; seed already offset for this choice


class ChoiceStreams:
    """The admitted engine requests of one HTTP request; iterate with ``merged()`` exactly once."""

    def __init__(self, engine, started: list[tuple[ChoiceSpec, str, AsyncIterator[GenerationDelta]]]) -> None:
        self.engine = engine
        self.started = started
        self.request_ids = [rid for _, rid, _ in started]
        self.shut_down = False  # aborted because the server is going down (not finished, not by the client)
        # Safety net for the one path no finally covers: the response object is dropped before its
        # body was ever iterated (the client left between the handler's return and the first byte).
        self._finalizer = weakref.finalize(self, _abort_soon, engine, tuple(self.request_ids))

    @classmethod
    def admit(cls, engine, specs: Sequence[ChoiceSpec], base_id: str, priority: int,
              cache_salt: Optional[str] = None, stream: bool = True, stall_probe=None) -> "ChoiceStreams":
        """Call ``engine.generate`` for every choice; on any error abort the ones already admitted.
        ``stream=False``: each choice's deltas arrive as one merged final delta. ``stall_probe``: the
        client connection's (shared by every choice: one connection carries them all)."""
        check = getattr(engine, "check_admission", None)
        if check is not None:  # the whole fan-out at once: admit all of it or nothing (never n-1 to abort)
            check([len(engine.tokenize(s.prompt)) if isinstance(s.prompt, str) else len(s.prompt) for s in specs])
        started = []
        # Only when given: an engine front end that predates the options still serves unsalted,
        # streamed requests.
        extra = {} if cache_salt is None else {"cache_salt": cache_salt}
        if not stream:
            extra["stream"] = False
        if stall_probe is not None:
            extra["stall_probe"] = stall_probe
        try:
            for spec in specs:
                rid = base_id if len(specs) == 1 else f"{base_id}-{spec.index}"
                deltas = engine.generate(spec.prompt, spec.params, request_id=rid, priority=priority, **extra)
                started.append((spec, rid, deltas))
        except BaseException:
            _abort_soon(engine, tuple(rid for _, rid, _ in started))
            raise
        return cls(engine, started)

    async def confirmed(self) -> None:
        """Wait until every choice's engine has admitted it, where the engine answers later than
        ``generate`` returns (an engine front end over other processes: its streams have
        ``admitted()``, aioinfer/ray/stream.py); on a refusal, abort every choice and raise the
        engine's error, so that the HTTP request fails whole, as a local engine's would. A local
        engine's streams were admitted inside ``generate``: this returns at once, awaiting nothing."""
        pending = [stream.admitted() for _, _, stream in self.started if hasattr(stream, "admitted")]
        if not pending:
            return
        try:
            outcomes = await asyncio.gather(*pending, return_exceptions=True)
        except BaseException:  # cancelled (the client left): nothing of it may run on
            await self._close_unread()
            raise
        failure = next((o for o in outcomes if isinstance(o, BaseException)), None)
        if failure is not None:
            await self._close_unread()
            raise failure

    async def _close_unread(self) -> None:
        # No consumer iterates these streams yet: closing them here is closing them in their one owner.
        for _, _, stream in self.started:
            await stream.aclose()
        await self.close()

    async def merged(self) -> AsyncIterator[tuple[ChoiceSpec, GenerationDelta]]:
        """(choice, delta) pairs in arrival order; raises the first error of any choice."""
        try:
            if len(self.started) == 1:
                spec, _, stream = self.started[0]
                try:
                    async for delta in stream:
                        yield spec, delta
                finally:
                    await stream.aclose()
            else:
                async for item in self._pumped():
                    yield item
        finally:
            await self.close()

    async def abort_for_shutdown(self) -> None:
        """End every choice now (each gets its final delta, finish_reason "abort"): the server stops."""
        self.shut_down = True
        for rid in self.request_ids:
            await self.engine.abort(rid, cause="shutdown")

    async def close(self) -> None:
        self._finalizer.detach()
        for rid in self.request_ids:
            await self.engine.abort(rid)

    async def _pumped(self) -> AsyncIterator[tuple[ChoiceSpec, GenerationDelta]]:
        # Bounded: a slow client makes the pumps wait, so the engine's slow-consumer limit still applies.
        queue: asyncio.Queue = asyncio.Queue(maxsize=len(self.started))
        tasks = [asyncio.create_task(_pump(spec, stream, queue), name=f"aioinfer-choice-{rid}")
                 for spec, rid, stream in self.started]
        try:
            remaining = len(tasks)
            while remaining:
                spec, delta, error = await queue.get()
                if error is not None:
                    raise error
                if delta is None:
                    remaining -= 1
                    continue
                yield spec, delta
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def _pump(spec: ChoiceSpec, stream: AsyncIterator[GenerationDelta], queue: asyncio.Queue) -> None:
    try:
        async for delta in stream:
            await queue.put((spec, delta, None))
    except Exception as exc:  # noqa: BLE001 - handed to the consumer, which raises it
        await queue.put((spec, None, exc))
        return
    finally:
        await stream.aclose()
    await queue.put((spec, None, None))


def _abort_soon(engine, request_ids: tuple[str, ...]) -> None:
    if not request_ids:
        return
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return  # no loop (interpreter shutdown): the engine is going away too
    loop.create_task(_abort_all(engine, request_ids))


async def _abort_all(engine, request_ids: tuple[str, ...]) -> None:
    for rid in request_ids:
        await engine.abort(rid)
