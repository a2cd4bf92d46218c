"""Load generator for OpenAI-compatible streaming servers (aioinfer, vLLM, ...).

Run ``python -m loadtest.loadtest --help``. The pieces are importable so that tests (and other
tools) can drive them with an injected ``httpx`` transport:

- :mod:`loadtest.workload`  seeded prompts, request bodies, Poisson arrival schedules
- :mod:`loadtest.client`    one streaming request -> :class:`~loadtest.client.RequestRecord`
- :mod:`loadtest.runner`    closed-loop levels and open-loop (Poisson) levels under anyio
- :mod:`loadtest.metrics`   per-level summary: throughput, goodput, percentiles
- :mod:`loadtest.report`    compact table and JSON results
- :mod:`loadtest.plot`      ``--plot`` PNG: TTFT / ITL distributions and throughput per level
"""
