"""Probe: event-loop µs of the checks one incoming request passes before the engine sees it (CPU).

What one incoming streaming request costs the event loop before the engine sees it, in the
checks aioinfer runs on it (CPU, any machine): the OpenAI prompt-form check, the engine's token-id
validation, the per-choice SamplingParams copy, and the client-stall probe of a new connection
while ``--open-sockets`` other TCP connections are open (a burst of arrivals).

    python -m benchmarks.probes.request_ingest --prompt-len 560 --open-sockets 256

At 256 simultaneous arrivals every microsecond here is paid 256 times on the loop before the last
request is admitted, beside the HTTP parsing and the streams already running: the last arrival's
time to first token. Run it with PYTHONPATH set to another tree to compare builds.
"""

from __future__ import annotations

import argparse
import random
import socket
import time
import timeit

from benchmarks.common import dump, environment, format_table


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompt-len", type=int, default=560, help="token ids per prompt (workload 1's mean)")
    p.add_argument("--open-sockets", type=int, default=256)
    p.add_argument("--number", type=int, default=2000)
    p.add_argument("--out", default=None)
    args = p.parse_args()

    from aioinfer.engine.input_processor import InputProcessor
    from aioinfer.entrypoints.openai import client_stall
    from aioinfer.entrypoints.openai.protocol import check_prompt
    from aioinfer.sampling_params import SamplingParams

    rng = random.Random(0)
    ids = [rng.randrange(10000) for _ in range(args.prompt_len)]
    inputs = InputProcessor(None, 151936, 32768, (0,), seed=0)
    params = SamplingParams(max_tokens=100, temperature=0, stop=["\n\n"], ignore_eos=True)

    def per_call(fn) -> float:
        return min(timeit.repeat(fn, number=args.number, repeat=3)) / args.number * 1e6

    results = {
        "check_prompt": per_call(lambda: check_prompt(ids)),
        "input_processor_tokenize": per_call(lambda: inputs.tokenize(ids)),
        "sampling_params_clone": per_call(params.clone),
    }
    listener = socket.create_server(("127.0.0.1", 0))
    open_pairs = []
    for _ in range(args.open_sockets):
        client = socket.create_connection(listener.getsockname())
        open_pairs.append((client, listener.accept()[0]))
    spent = 0.0
    rounds = 32
    for _ in range(rounds):  # each request on a connection that is new to the process
        client = socket.create_connection(listener.getsockname())
        served = listener.accept()[0]
        open_pairs.append((client, served))
        started = time.perf_counter()
        client_stall.probe_for({"client": served.getpeername(), "server": served.getsockname()})
        spent += time.perf_counter() - started
    results["stall_probe_new_connection"] = spent / rounds * 1e6
    for pair in open_pairs:
        for s in pair:
            s.close()
    listener.close()

    dump(args.out, {"benchmark": "request_ingest", "environment": environment(), "argv": vars(args),
                    "us_per_request": results})
    print(format_table(["check", "us per request"], [[k, v] for k, v in results.items()]))


if __name__ == "__main__":
    main()
