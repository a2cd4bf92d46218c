"""One load-generating client process of ``serve_throughput``: its share of the workload, all
requests sent at once at an agreed wall-clock time, each a streaming completion timed chunk by chunk.

    python -m benchmarks.serve_clients --url URL --model NAME --requests FILE --start-at T --out FILE

FILE holds ``[[prompt token ids, max_tokens], ...]``. Times are ``time.time()`` so that the driver
can merge the processes' records onto one clock; the record of each request comes from
``loadtest.client.run_request`` (the load generator's own SSE parsing and timing). The process's
CPU seconds go with the results: a client near 100 % of a core would be measuring itself.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _run(url: str, model: str, requests: list, start_at: float, timeout: float,
               cache_salt: str = None) -> tuple[list[dict], float]:
    import anyio
    import httpx

    from loadtest.client import ClientConfig, RequestRecord, run_request

    limits = httpx.Limits(max_connections=len(requests) + 8, max_keepalive_connections=len(requests) + 8)
    records: list[dict] = []
    async with httpx.AsyncClient(base_url=url, timeout=timeout, limits=limits) as client:
        await anyio.sleep(max(0.0, start_at - time.time()))
        cpu0 = _cpu_s()

        async def one(index: int, prompt: list[int], max_tokens: int) -> None:
            body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                    "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
            if cache_salt:
                body["cache_salt"] = cache_salt  # a repeated run computes its prompts again (vLLM has the field too)
            record = RequestRecord(index=index)
            sent = time.time()
            await run_request(client, body, record, ClientConfig(), clock=time.time,
                              known_prompt_tokens=len(prompt))
            records.append({**record.to_json(), "sent": sent})

        async with anyio.create_task_group() as tg:
            for index, (prompt, max_tokens) in enumerate(requests):
                tg.start_soon(one, index, prompt, max_tokens)
        cpu = _cpu_s() - cpu0
    return records, cpu


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--requests", required=True, help="JSON file: [[prompt ids, max_tokens], ...]")
    p.add_argument("--start-at", type=float, required=True, help="time.time() at which to send everything")
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--cache-salt", default=None, help="prefix-cache salt for every request of the run")
    p.add_argument("--out", required=True)
    args = p.parse_args()

    import anyio

    try:
        import uvloop  # noqa: F401

        options = {"use_uvloop": True}
    except ImportError:
        options = {}
    requests = json.loads(Path(args.requests).read_text())
    records, cpu = anyio.run(_run, args.url, args.model, requests, args.start_at, args.timeout, args.cache_salt, backend="asyncio",
                             backend_options=options)
    Path(args.out).write_text(json.dumps({"records": records, "cpu_s": cpu}))  # CPU from the start on


if __name__ == "__main__":
    main()
