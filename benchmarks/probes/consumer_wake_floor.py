"""Probe: event-loop CPU per token handed to asyncio consumers, the floor under the async Engine (CPU).

What delivering one token to one asyncio consumer costs the event loop, before any engine work:
the floor under the async ``Engine``'s loop budget per streamed token (CPU, any machine).

    python -m benchmarks.probes.consumer_wake_floor --streams 256 --steps 400 --out wake_floor.json

``--streams`` consumer tasks each wait for their next token while one producer on the loop (as the
engine's step hand-over does) delivers one token to every stream per "step", ``--steps`` times:

- ``future``: the least a wake-up can be, a bare asyncio future per wait, set by the producer and
  awaited by the consumer (what aioinfer's ``RequestChannel`` waits on).
- ``channel``: aioinfer's own per-request delivery, ``RequestChannel.deliver`` of a
  ``GenerationDelta`` into the bounded memory-object stream and the consumer's ``iterate_deltas``
  (what ``Engine.generate`` returns), without output processing or detokenization.

Reported: the loop thread's CPU µs per delivered token (user + system, ``RUSAGE_THREAD``). In one
process the loop shares the interpreter lock with the GPU thread, so at a GPU thread cost of G µs a
token the async ``Engine`` can deliver at most 1 / (G + this) of what the offline engine does at G.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import time
from typing import Any

from benchmarks.common import dump, environment, format_table


def _thread_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_THREAD)
    return usage.ru_utime + usage.ru_stime


async def _futures(streams: int, steps: int) -> tuple[float, int]:
    loop = asyncio.get_running_loop()
    waiting: list[Any] = [None] * streams
    received = 0

    async def consumer(i: int) -> None:
        nonlocal received
        for _ in range(steps):
            future = waiting[i] = loop.create_future()
            await future
            received += 1

    tasks = [asyncio.ensure_future(consumer(i)) for i in range(streams)]
    await asyncio.sleep(0)
    started = _thread_cpu()
    for step in range(steps):
        for future in waiting:  # one step's tokens, as the engine's hand-over delivers them
            future.set_result(None)
        while received < streams * (step + 1):  # every consumer took its token (and waits again)
            await asyncio.sleep(0)
    await asyncio.gather(*tasks)
    return _thread_cpu() - started, received


async def _channels(streams: int, steps: int) -> tuple[float, int]:
    from aioinfer.async_engine.request_channel import RequestChannel, event_factory, iterate_deltas
    from aioinfer.engine.delta import GenerationDelta

    new_event = event_factory()
    channels = [RequestChannel.open(f"r{i}", 100, buffer_size=16) for i in range(streams)]
    received = 0

    def abort(channel, cause, notify=False) -> None:
        raise AssertionError(f"a consumer left early ({cause})")

    async def consumer(channel: RequestChannel) -> None:
        nonlocal received
        async for delta in iterate_deltas(channel, None, new_event, abort):
            received += len(delta.token_ids)

    tasks = [asyncio.ensure_future(consumer(c)) for c in channels]
    await asyncio.sleep(0)
    prompt = list(range(100))
    started = _thread_cpu()
    for step in range(steps):
        now = time.monotonic()
        last = step == steps - 1
        for channel in channels:
            channel.deliver(GenerationDelta(channel.request_id, [7], " x", None, "length" if last else None, None,
                                            100, step + 1, 0, prompt), now)
        await asyncio.sleep(0)
        while any(c.queued for c in channels):
            await asyncio.sleep(0)
    await asyncio.gather(*tasks)
    return _thread_cpu() - started, received


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--streams", type=int, default=256)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    rows, results = [], {}
    for name, run in (("future", _futures), ("channel", _channels)):
        per_token = []
        for _ in range(args.repeats):
            cpu, received = asyncio.run(run(args.streams, args.steps))
            assert received == args.streams * args.steps, (received, args.streams * args.steps)
            per_token.append(cpu / received * 1e6)
        results[name] = {"us_per_token": per_token, "best_us_per_token": min(per_token)}
        rows.append([name, min(per_token), sorted(per_token)[len(per_token) // 2]])
    print(format_table(["delivery", "best µs/token", "median µs/token"], rows))
    dump(args.out, {"environment": environment(), "args": vars(args), "results": results})


if __name__ == "__main__":
    main()
