"""One workload through the three ways aioinfer is used, in one run: the offline ``LLM``, the async
``Engine`` (every request a concurrent stream on one event loop) and the real server
(``hypercorn aioinfer.app:app`` and streaming clients in several processes); optionally vLLM's
server the same way. Reports output tok/s, each path's share of the offline rate, TTFT / TPOT / ITL
percentiles, and the host budget: CPU µs per output token of each thread of the serving process.

    python -m benchmarks.serve_throughput --model qwen2.5-0.5b --tokenizer DIR --out serve_0.5b.json
    python -m benchmarks.serve_throughput --model tiny --device cpu --null-runner-ms 5 --num-requests 64 \\
        --max-input-len 200 --max-output-len 200 --clients 2 --tokenizer DIR      # the CPU (host-cost) variant

The workload is benchmarks/README.md's workload 1 (256 requests, prompts and outputs of 100-1024 tokens,
random ids, EOS ignored, greedy), dummy weights. ``--tokenizer`` (a folder of tokenizer files; a
Qwen2.5 tokenizer for the Qwen shapes) makes every path detokenize as real serving does; without
one, outputs are token ids only and the server sends almost no text. ``--null-runner-ms`` replaces
the model by a runner that sleeps that long per step (benchmarks/null_runner.py): the run then
measures the host's own work, on any CPU.

CPU per thread (Linux /proc): ``gpu_thread`` (the engine's step loop: scheduling, input
preparation, launches, output bookkeeping), ``main_thread`` (the event loop: detokenization,
streams, SSE, HTTP; in the offline path, everything), ``other_threads`` (torch's CPU pool,
hypercorn's helpers, CUDA's). The sum of the first two near the wall time means the interpreter
lock is the limit.

Every timed run has its own prefix-cache salt (offline, ``Engine`` and server alike): a repeat
computes its prompts again instead of reading them from the cache. ``--output-len 1`` keeps the
prompts and asks one token of each: the burst of arrivals alone, its time to first token and the
loop's CPU per request.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

from benchmarks.common import (default_device, workload1_for, SHAPES, dump, environment, fresh_cache_salt, format_table, output_tokens,
                               run_child, workload1, write_child_result, write_dummy_model)
from benchmarks.proc_cpu import children, process_cpu, split_by_role, thread_cpu
from benchmarks.serve_driver import cpu_list, latencies, run_clients

MODES = ("offline", "engine", "server")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=sorted(SHAPES), default="qwen2.5-0.5b")
    p.add_argument("--modes", default="offline,engine,server", help=f"comma separated, of {MODES}")
    p.add_argument("--tokenizer", default=None, help="folder of tokenizer files for every path")
    p.add_argument("--device", default=None, help="cuda (default when present) or cpu")
    p.add_argument("--null-runner-ms", type=float, default=None, help="no model: each step sleeps this long")
    p.add_argument("--num-requests", type=int, default=256)
    p.add_argument("--max-input-len", type=int, default=1024)
    p.add_argument("--max-output-len", type=int, default=1024)
    p.add_argument("--output-len", type=int, default=None,
                   help="every request's max_tokens (same prompts); 1: the burst of arrivals alone, time to first token")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--clients", type=int, default=8, help="client processes for the server")
    p.add_argument("--repeats", type=int, default=1, help="timed runs per mode (after one warm-up)")
    p.add_argument("--engine-env", action="append", default=[], metavar="KEY=VALUE",
                   help="extra AIOINFER_* setting for every path (e.g. AIOINFER_STREAM_INTERVAL=4)")
    p.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                   help="extra hypercorn argument for aioinfer's server (repeatable, e.g. --server-arg=--backlog=100)")
    p.add_argument("--ray-replicas", default="", metavar="N[,M...]",
                   help="also `serve --ray` with N engine replicas sharing the device (each 1/N of the GPU and of "
                        "its memory), once per count; needs aioinfer[ray]")
    p.add_argument("--ray-ingress-replicas", type=int, default=2, help="with --ray-replicas: OpenAI ingress replicas")
    p.add_argument("--vllm-server", action="store_true",
                   help="also vLLM's server (installed under --vllm-pythonpath)")
    p.add_argument("--vllm-pythonpath", default=os.environ.get("VLLM_PYTHONPATH"),
                   help="PYTHONPATH of vLLM's server alone (e.g. /tmp/vllm-site), so that its packages "
                        "never shadow aioinfer's; default: $VLLM_PYTHONPATH, else the inherited one")
    p.add_argument("--timeout", type=float, default=540, help="seconds per mode")
    p.add_argument("--out", default=None)
    p.add_argument("--log-dir", default=None, help="keep the server logs here (default: a temporary file each)")
    p.add_argument("--py-spy", default=None, metavar="PATH",
                   help="py-spy binary: record the server's threads during the timed run (raw stacks in --log-dir)")
    p.add_argument("--py-spy-gil", action="store_true", help="with --py-spy: sample only the thread holding the GIL")
    p.add_argument("--child-mode", default=None, help=argparse.SUPPRESS)
    p.add_argument("--child-out", default=None, help=argparse.SUPPRESS)
    p.add_argument("--folder", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()

    device = default_device(args.device)
    shape = SHAPES[args.model]
    requests = workload1_for(shape, args.num_requests, args.max_input_len, args.max_output_len)
    if args.output_len is not None:
        requests = [dataclasses.replace(r, max_tokens=args.output_len) for r in requests]
    if args.child_mode is not None:
        write_child_result(args.child_out, _child(args, device, requests))
        return

    env = environment()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_dummy_model(shape, tmp)
        for mode in [m for m in args.modes.split(",") if m]:
            if mode == "server":
                results["server"] = run_server(args, device, folder, requests)
            else:
                cmd = ["benchmarks.serve_throughput", "--model", args.model, "--folder", str(folder),
                       "--device", device, "--child-mode", mode, *_passthrough(args)]
                results[mode] = run_child(cmd, args.timeout)
            print(f"{mode}: {_brief(results[mode])}", flush=True)
        for count in [int(c) for c in args.ray_replicas.split(",") if c]:
            results[f"ray-{count}"] = run_server(args, device, folder, requests, ray_replicas=count)
            print(f"ray-{count}: {_brief(results[f'ray-{count}'])}", flush=True)
        if args.vllm_server:
            results["vllm-server"] = run_server(args, device, folder, requests, vllm=True)
            print(f"vllm-server: {_brief(results['vllm-server'])}", flush=True)
    report(args, env, shape, requests, results)


def _passthrough(args) -> list[str]:
    out = ["--num-requests", str(args.num_requests), "--max-input-len", str(args.max_input_len),
           "--max-output-len", str(args.max_output_len), *(["--output-len", str(args.output_len)] if args.output_len else []),
           "--max-num-seqs", str(args.max_num_seqs),
           "--max-num-batched-tokens", str(args.max_num_batched_tokens), "--repeats", str(args.repeats)]
    if args.tokenizer:
        out += ["--tokenizer", args.tokenizer]
    if args.null_runner_ms is not None:
        out += ["--null-runner-ms", str(args.null_runner_ms)]
    for item in args.engine_env:
        out += ["--engine-env", item]
    return out


def _brief(r: dict) -> str:
    if "error" in r:
        return r["error"]
    spec = r.get("spec_decode")
    drafts = f" (drafts: {spec['drafts']} rounds, {spec['accepted_tokens']} accepted)" if spec else ""
    return f"{r['tok_per_s']:,.0f} tok/s over {r['seconds']:.2f} s{drafts}"


def engine_settings(args, device: str, requests) -> dict[str, Any]:
    """The engine options every path uses (the server gets them as AIOINFER_* variables)."""
    settings: dict[str, Any] = dict(
        load_format="dummy", dtype="bfloat16" if device == "cuda" else "float32", device=device, max_model_len=2048,
        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens)
    if device == "cpu":
        settings["num_kv_blocks"] = len(requests) * (2048 // 16 + 1)
    if args.tokenizer:
        settings["tokenizer"] = args.tokenizer
    return settings


def _engine_env(args) -> dict[str, str]:
    env = {}
    for item in args.engine_env:
        key, sep, value = item.partition("=")
        if not sep or not key.startswith("AIOINFER_"):
            raise SystemExit(f"--engine-env wants AIOINFER_KEY=VALUE, got {item!r}")
        env[key] = value
    return env


# ----------------------------------------------------------------------------- offline and async children

def _child(args, device: str, requests) -> dict[str, Any]:
    if args.null_runner_ms is not None:
        from benchmarks import null_runner

        null_runner.install(args.null_runner_ms / 1e3)
    options = engine_settings(args, device, requests)
    options.update(_env_options(args))
    if args.child_mode == "offline":
        return _offline(args, options, requests)
    import anyio

    try:
        import uvloop  # noqa: F401

        backend_options = {"use_uvloop": True}
    except ImportError:
        backend_options = {}
    return anyio.run(_async_engine, args, options, requests, backend="asyncio", backend_options=backend_options)


def _env_options(args) -> dict[str, Any]:
    """--engine-env AIOINFER_X=V as engine keyword arguments, typed as the server would type them."""
    from aioinfer.server_config import ENGINE_OPTIONS, ServerConfig

    config = ServerConfig.from_env(_engine_env(args))
    return {k: v for k, v in config.engine_kwargs.items() if k in ENGINE_OPTIONS}


def _offline(args, options: dict[str, Any], requests) -> dict[str, Any]:
    import inspect

    from aioinfer import LLM, Engine, SamplingParams

    # The async Engine's own options (stream_interval, host_cpu, ...) mean nothing to the offline LLM.
    async_only = {name for name, p in inspect.signature(Engine.__init__).parameters.items() if p.kind is p.KEYWORD_ONLY}
    llm = LLM(model=args.folder, **{k: v for k, v in options.items() if k not in async_only})
    warm = workload1(num_requests=8, seed=1, max_input_len=200, max_output_len=110, max_token_id=500)
    llm.generate([r.prompt for r in warm], [SamplingParams(max_tokens=r.max_tokens, ignore_eos=True, temperature=0)
                                            for r in warm], use_tqdm=False)
    params = [SamplingParams(max_tokens=r.max_tokens, ignore_eos=True, temperature=0) for r in requests]
    runs = []
    for _ in range(args.repeats):
        before = thread_cpu()
        start = time.perf_counter()
        # A fresh salt per run: a repeat computes its prompts again instead of reading them from the cache.
        outs = llm.generate([r.prompt for r in requests], params, use_tqdm=False, cache_salt=fresh_cache_salt())
        seconds = time.perf_counter() - start
        got = sum(len(o.outputs[0].token_ids) for o in outs)
        runs.append({"output_tokens": got, "seconds": seconds, "tok_per_s": got / seconds,
                     "cpu_s": split_by_role(before, thread_cpu(), os.getpid())})
    return _with_spec_counts(_best(runs), llm.engine)


async def _async_engine(args, options: dict[str, Any], requests) -> dict[str, Any]:
    import anyio

    from aioinfer import Engine, SamplingParams

    options = dict(options, max_waiting_requests=len(requests) + 64,
                   max_waiting_prompt_tokens=sum(len(r.prompt) for r in requests) + 1_000_000)

    async def run(engine, reqs) -> tuple[float, list[dict]]:
        salt = fresh_cache_salt()
        records: list[dict] = []

        async def one(r) -> None:
            params = SamplingParams(max_tokens=r.max_tokens, ignore_eos=True, temperature=0.0)
            times, tokens = [], 0
            sent = time.time()
            async for delta in engine.generate(r.prompt, params, cache_salt=salt):
                if delta.token_ids:
                    times.append(time.time())
                    tokens += len(delta.token_ids)
            records.append(_record(sent, times, tokens))

        start = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for r in reqs:
                tg.start_soon(one, r)
        return time.perf_counter() - start, records

    async with Engine(args.folder, **options) as engine:
        warm = workload1(num_requests=8, seed=1, max_input_len=200, max_output_len=110, max_token_id=500)
        await run(engine, warm)
        runs = []
        for _ in range(args.repeats):
            before = thread_cpu()
            seconds, records = await run(engine, requests)
            cpu = split_by_role(before, thread_cpu(), os.getpid())
            got = sum(r["output_tokens"] for r in records)
            runs.append({"output_tokens": got, "seconds": seconds, "tok_per_s": got / seconds, "cpu_s": cpu,
                         **latencies(records)})
        core = engine._core
    return _with_spec_counts(_best(runs), core)


def _with_spec_counts(result: dict, core) -> dict:
    """Speculative decoding's totals over the process (warm-up included), when it is on."""
    policy = getattr(getattr(core, "scheduler", None), "draft_policy", None)
    if policy is not None:
        result["spec_decode"] = {"drafts": policy.num_drafts, "draft_tokens": policy.num_draft_tokens,
                                 "accepted_tokens": policy.num_accepted_tokens, "pauses": policy.num_pauses}
    return result


def _record(sent: float, times: list[float], tokens: int) -> dict:
    return {"sent": sent, "ttft": times[0] - sent if times else None,
            "itl": [b - a for a, b in zip(times, times[1:])],
            "e2e": (times[-1] - sent) if times else None, "output_tokens": tokens}


def _best(runs: list[dict]) -> dict:
    best = dict(max(runs, key=lambda r: r["tok_per_s"]))
    best["runs_tok_per_s"] = [round(r["tok_per_s"]) for r in runs]
    if all("ttft_ms" in r for r in runs):
        best["runs_ttft_p99_ms"] = [r["ttft_ms"]["p99"] and round(r["ttft_ms"]["p99"]) for r in runs]
    return best


# ----------------------------------------------------------------------------- the server

def run_server(args, device: str, folder: Path, requests, vllm: bool = False,
               ray_replicas: int = 0) -> dict[str, Any]:
    """One server mode: aioinfer's (hypercorn), vLLM's, or ``ray_replicas`` engine replicas behind
    Ray Serve (``python -m aioinfer serve --ray``: the replicas share the one device, each with
    1/N of it and of the memory fraction; the client's CPU figures cover the clients only)."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    if args.log_dir:
        Path(args.log_dir).mkdir(parents=True, exist_ok=True)
    tag = "vllm" if vllm else f"ray{ray_replicas}" if ray_replicas else "aioinfer"
    log = tempfile.NamedTemporaryFile(prefix=f"server-{args.model}-{tag}-", suffix=".log",
                                      delete=False, dir=args.log_dir)
    if vllm:
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder), "--load-format",
               "dummy", "--dtype", "bfloat16", "--port", str(port), "--max-model-len", "2048",
               "--max-num-seqs", str(args.max_num_seqs), "--max-num-batched-tokens", str(args.max_num_batched_tokens)]
        if args.tokenizer:
            cmd += ["--tokenizer", args.tokenizer]
        env = dict(os.environ, VLLM_USE_FLASHINFER_SAMPLER="0")
        if args.vllm_pythonpath:
            env["PYTHONPATH"] = args.vllm_pythonpath
        model_name = str(folder)
    else:
        app = "benchmarks.null_runner_app:app" if args.null_runner_ms is not None else "aioinfer.app:app"
        cmd = [sys.executable, "-m", "hypercorn", app, "--bind", f"127.0.0.1:{port}", *args.server_arg]
        settings = engine_settings(args, device, requests)
        if ray_replicas:
            if args.null_runner_ms is not None:
                raise SystemExit("--ray-replicas runs the real engine: not with --null-runner-ms")
            share = 1 / ray_replicas
            cmd = [sys.executable, "-m", "aioinfer", "serve", "--ray", "--num-replicas", str(ray_replicas),
                   "--ingress-replicas", str(args.ray_ingress_replicas), "--host", "127.0.0.1", "--port", str(port),
                   "--num-gpus-per-replica", f"{share if device == 'cuda' else 0:.4f}",
                   # Ray's CPU reservations are logical: none here, so that any replica count fits the host
                   "--num-cpus-per-replica", "0", "--ingress-num-cpus", "0"]
            settings["gpu_memory_utilization"] = round(0.9 * share, 4)
        env = {k: v for k, v in os.environ.items() if not k.startswith("AIOINFER_")}
        env.update({"AIOINFER_" + k.upper(): str(v) for k, v in settings.items()})
        env.update(AIOINFER_MODEL=str(folder), AIOINFER_MAX_WAITING_REQUESTS=str(len(requests) + 64),
                   AIOINFER_MAX_WAITING_PROMPT_TOKENS=str(sum(len(r.prompt) for r in requests) + 1_000_000),
                   AIOINFER_MAX_N="64", PYTHONUNBUFFERED="1")
        if args.null_runner_ms is not None:
            env["AIOINFER_BENCH_NULL_STEP_MS"] = str(args.null_runner_ms)
        env.update(_engine_env(args))
        model_name = folder.name
    if not vllm:
        env["PYTHONPATH"] = os.pathsep.join([str(Path.cwd()), env.get("PYTHONPATH", "")])
    print("+", " ".join(cmd), flush=True)
    server = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_ready(url, server, model_name, vllm, args.timeout)
        warm = workload1(num_requests=16, seed=1, max_input_len=200, max_output_len=110, max_token_id=500)
        run_clients(url, model_name, warm, min(args.clients, 2))  # first kernels, connections, allocator
        serving = [server.pid] if vllm else [] if ray_replicas else [_serving_pid(server.pid)]
        runs = []
        for _ in range(args.repeats):
            before = {pid: thread_cpu(pid) for pid in serving}
            cpu_before = {pid: process_cpu(pid) for pid in serving}
            spy = _start_py_spy(args, serving[0], f"{args.model}-{tag}") if serving else None
            result = run_clients(url, model_name, requests, args.clients, _client_cpus(args, vllm))
            if spy is not None:
                spy.wait(timeout=120)
            if not vllm and not ray_replicas:
                result["cpu_s"] = split_by_role(before[serving[0]], thread_cpu(serving[0]), serving[0])
            result["server_process_cpu_s"] = sum(process_cpu(pid) - cpu_before[pid] for pid in serving)
            runs.append(result)
        return _best(runs)
    except Exception as exc:  # noqa: BLE001 - reported in the table, the log path with it
        return {"error": f"{type(exc).__name__}: {exc} (server log: {log.name})"}
    finally:
        try:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=60)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(server.pid, signal.SIGKILL)
        print(f"server log: {log.name}", flush=True)


def _start_py_spy(args, pid: int, tag: str):
    """py-spy sampling the server's threads for about the timed run (raw collapsed stacks)."""
    if not args.py_spy:
        return None
    out = Path(args.log_dir or tempfile.gettempdir()) / f"pyspy-{tag}{'-gil' if args.py_spy_gil else ''}.txt"
    return subprocess.Popen([args.py_spy, "record", "--pid", str(pid), "--duration", "12", "--rate", "250",
                             "--format", "raw", "--threads", "--nonblocking", *(["--gil"] if args.py_spy_gil else []),
                             "-o", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _serving_pid(master: int) -> int:
    """hypercorn's worker process (its master only supervises), or the master run with --workers 0."""
    candidates = [master, *children(master)]
    named = [pid for pid in candidates if any(name.startswith("aioinfer-gpu") for name, _ in thread_cpu(pid).values())]
    return named[0] if named else max(candidates, key=lambda pid: len(thread_cpu(pid)))


def _wait_ready(url: str, server, model: str, vllm: bool, timeout: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    path = "/health" if vllm else "/ready"
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited with {server.returncode}")
        try:
            if httpx.get(url + path, timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError("the server was not ready in time")


def _client_cpus(args, vllm: bool) -> Optional[set[int]]:
    """Where the client processes may run: off the CPU the server's threads are pinned to
    (``AIOINFER_HOST_CPU``) and off that CPU's hyperthread siblings. The clients stand for remote
    users: left to the OS, one of them sometimes lands on the pinned CPU (or its sibling) and takes
    turns with the server's event loop there, which no deployment that reserves the CPU would see.
    None (anywhere) when nothing is pinned."""
    host_cpu = None if vllm else _engine_env(args).get("AIOINFER_HOST_CPU")
    if not host_cpu or not hasattr(os, "sched_getaffinity"):
        return None
    reserved = {int(host_cpu)}
    try:
        reserved |= cpu_list(Path(f"/sys/devices/system/cpu/cpu{int(host_cpu)}/topology/thread_siblings_list").read_text())
    except (OSError, ValueError):
        pass
    rest = os.sched_getaffinity(0) - reserved
    return rest or None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ----------------------------------------------------------------------------- report

def report(args, env: dict, shape, requests, results: dict[str, Any]) -> None:
    offline = results.get("offline", {}).get("tok_per_s")
    vllm_server = results.get("vllm-server", {}).get("tok_per_s")
    rows = []
    for mode, r in results.items():
        if "error" in r:
            rows.append([mode, None, None, None, None, None, None, None, None, None, None, r["error"]])
            continue
        got = r["output_tokens"]
        cpu = r.get("cpu_s") or {}
        per_token = {k: 1e6 * v / got for k, v in cpu.items()}
        ttft, tpot, itl = r.get("ttft_ms", {}), r.get("tpot_ms", {}), r.get("itl_ms", {})
        rows.append([mode, r["tok_per_s"], f"{r['tok_per_s'] / offline:.0%}" if offline else None,
                     ttft.get("p50"), ttft.get("p99"), tpot.get("p50"), itl.get("p50"), itl.get("p99"),
                     per_token.get("gpu_thread"), per_token.get("main_thread"), per_token.get("other_threads"),
                     "; ".join(note for note in (
                         f"busiest client {r['client_busiest_cpu_share']:.0%} of a core"
                         if "client_busiest_cpu_share" in r else "",
                         f"{r['listen_overflows']} handshakes dropped (full listen queue)"
                         if r.get("listen_overflows") else "",
                         f"{r['tok_per_s'] / vllm_server:.2f}x vLLM's server"
                         if vllm_server and (mode == "server" or mode.startswith("ray-")) else "",
                         f"{r['tok_per_s'] / results['server']['tok_per_s']:.2f}x the single server"
                         if mode.startswith("ray-") and results.get("server", {}).get("tok_per_s") else "") if note)])
    payload = {"benchmark": "serve_throughput (workload 1: offline LLM, async Engine, HTTP server)",
               "model": args.model, "environment": env, "argv": vars(args), "num_requests": len(requests),
               "output_tokens": output_tokens(requests), "results": results}
    dump(args.out, payload)
    print()
    what = f"null runner {args.null_runner_ms} ms/step" if args.null_runner_ms is not None else "dummy weights"
    print(f"workload 1, {args.model} ({what}), {env.get('device')}, {env['date']}; {len(requests)} requests, "
          f"{output_tokens(requests):,} output tokens; tokenizer: {args.tokenizer or 'none'}; "
          f"server clients: {args.clients} processes")
    print(format_table(["path", "tok/s", "of offline", "TTFT p50 ms", "TTFT p99 ms", "TPOT p50 ms", "ITL p50 ms",
                        "ITL p99 ms", "GPU thread CPU us/tok", "main thread (loop) us/tok", "other threads us/tok",
                        "note"], rows))


if __name__ == "__main__":
    main()
