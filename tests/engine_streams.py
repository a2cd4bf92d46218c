"""Reading async engines' delta streams in tests (Engine, DataParallelEngine alike)."""

from __future__ import annotations

import anyio


async def collect(stream):
    """Drain one request's deltas: (all token ids, all text, the last delta)."""
    tokens, text, last = [], "", None
    async for delta in stream:
        tokens += delta.token_ids
        text += delta.text
        last = delta
    return tokens, text, last


async def generate_all(engine, prompts, params) -> list[list[int]]:
    """Submit every prompt at once (one task each) and return their token ids, in prompt order."""
    results: list[list[int]] = [[] for _ in prompts]

    async def run(i: int) -> None:
        results[i] = (await collect(engine.generate(prompts[i], params)))[0]

    async with anyio.create_task_group() as tg:
        for i in range(len(prompts)):
            tg.start_soon(run, i)
    return results
