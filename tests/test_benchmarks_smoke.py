"""The maintained benchmarks (benchmarks/README.md's table) still run: each once on the CPU with a
tiny shape and a few requests, as its users run it (``python -m benchmarks.NAME`` in a subprocess).

Per script: it exits 0, prints its table last (or just before a closing line) and writes its JSON
with the fields docs/performance.md reads, every system or path it ran without an error. No number
is checked: a tiny model on a shared 2-core machine measures nothing. Workload 3 is the Triton
kernels themselves, so it runs only where there is a CUDA device (``gpu``). Workload 4's load
generator (``loadtest``) runs against a real server on a tiny model.

Also checked: the README's table lists exactly the maintained scripts, and every diagnostic in
benchmarks/probes/ has its line in probes/README.md and a one-line purpose atop its docstring.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from server_process import run_server
from tiny_models import make_tiny_model_dir

REPO = Path(__file__).resolve().parent.parent
BENCHMARKS = REPO / "benchmarks"
MAINTAINED = ["offline_throughput", "decode_latency", "paged_attention", "serve_throughput",
              "structured_output_rounds", "spec_decode"]
# Imported or started by the maintained scripts, never run on their own.
HELPERS = ["common", "serve_clients", "serve_driver", "proc_cpu", "null_runner", "null_runner_app", "triton_compiles", "vllm_peer"]
TIMEOUT = 300  # seconds per script: a few to 40 on an idle 2-core machine


def run_benchmark(module: str, *args: str) -> str:
    """``python -m benchmarks.<module> ARGS`` from the repository root; its stdout, or a failure with
    the end of both streams."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIOINFER_") or k == "AIOINFER_CACHE"}
    env.update(PYTHONPATH=os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]),
               PYTHONUNBUFFERED="1", AIOINFER_CPU_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", f"benchmarks.{module}", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=TIMEOUT)
    if proc.returncode != 0:
        pytest.fail(f"benchmarks.{module} exited with {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}"
                    f"\n--- stderr\n{proc.stderr[-4000:]}", pytrace=False)
    return proc.stdout


def last_table(stdout: str, first_column: str, trailing_lines: int = 0) -> list[list[str]]:
    """The rows of the markdown table that ends the output (``trailing_lines`` lines may follow it),
    whose header starts with ``first_column``."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    end = len(lines) - trailing_lines
    assert end > 0 and lines[end - 1].startswith("|"), f"no table at the end of the output:\n{stdout[-2000:]}"
    start = end
    while start > 0 and lines[start - 1].startswith("|"):
        start -= 1
    header, rule, *rows = lines[start:end]
    assert [c.strip() for c in header.strip("|").split("|")][0] == first_column, header
    assert set(rule) <= set("|-"), rule
    assert rows, "a table without rows"
    return [[c.strip() for c in row.strip("|").split("|")] for row in rows]


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory) -> Path:
    """A tiny HF folder: its tokenizer (ids < 512) serves the benchmarks' tiny shape (vocabulary 1,000)."""
    return make_tiny_model_dir(tmp_path_factory.mktemp("bench-tiny"), arch="qwen2")


@pytest.mark.parametrize("name", MAINTAINED)
def test_help(name):
    assert "usage:" in run_benchmark(name, "--help")


def test_readme_lists_exactly_the_maintained_scripts():
    readme = (BENCHMARKS / "README.md").read_text()
    listed = re.findall(r"^\| `(\w+)\.py`", readme, flags=re.M)
    assert sorted(listed) == sorted(MAINTAINED)
    assert "probes/README.md" in readme
    scripts = {p.stem for p in BENCHMARKS.glob("*.py")} - {"__init__"}
    assert scripts == set(MAINTAINED) | set(HELPERS), "a new script: add it to README's table or to probes/"


def test_every_probe_has_a_purpose_and_a_readme_line():
    listed = set(re.findall(r"^\| `(\w+)\.py`", (BENCHMARKS / "probes" / "README.md").read_text(), flags=re.M))
    probes = {p.stem for p in (BENCHMARKS / "probes").glob("*.py")} - {"__init__"}
    assert probes == listed
    for name in probes:
        doc = ast.get_docstring(ast.parse((BENCHMARKS / "probes" / f"{name}.py").read_text()))
        assert doc and doc.startswith("Probe: ") and len(doc.splitlines()[0]) <= 120, name


def test_offline_throughput(tmp_path):
    out = tmp_path / "w1.json"
    stdout = run_benchmark("offline_throughput", "--model", "tiny", "--device", "cpu", "--num-requests", "4",
                           "--skip-peers", "--out", str(out))
    rows = last_table(stdout, "system")
    assert rows[0][0] == "aioinfer" and float(rows[0][4].replace(",", "")) > 0
    result = json.loads(out.read_text())
    full = result["results"]["aioinfer"]["full"]
    assert full["output_tokens"] == result["floor_full"]["output_tokens"] and full["tok_per_s"] > 0


def test_offline_throughput_reports_a_vllm_peer_that_cannot_run(tmp_path):
    """--vllm where vLLM is not installed (CI): its row says why; aioinfer's numbers stay."""
    out = tmp_path / "w1.json"
    stdout = run_benchmark("offline_throughput", "--model", "tiny", "--device", "cpu", "--num-requests", "2",
                           "--skip-peers", "--vllm", "--vllm-pythonpath", str(tmp_path), "--out", str(out))
    rows = last_table(stdout, "system")
    assert [row[0] for row in rows] == ["aioinfer", "vllm"]
    result = json.loads(out.read_text())
    assert "No module named 'vllm'" in result["results"]["vllm"]["error"]
    assert result["aioinfer_over_vllm"] is None and result["results"]["aioinfer"]["full"]["tok_per_s"] > 0


def test_decode_latency(tmp_path):
    out = tmp_path / "w2.json"
    stdout = run_benchmark("decode_latency", "--model", "tiny", "--device", "cpu", "--batches", "1,4",
                           "--prompt-len", "16", "--new-tokens", "8", "--repeats", "1", "--out", str(out))
    assert [row[1] for row in last_table(stdout, "system")] == ["1", "4"]
    results = json.loads(out.read_text())["results"]
    assert [(r["system"], r["batch"]) for r in results] == [("aioinfer", 1), ("aioinfer", 4)]
    assert all(r["tpot_ms"] > 0 for r in results)


@pytest.mark.gpu  # the Triton kernels are the workload: nothing of it runs on a CPU
def test_paged_attention(tmp_path):
    out = tmp_path / "w3.json"
    stdout = run_benchmark("paged_attention", "--models", "qwen2.5-0.5b", "--batches", "1", "--contexts", "128",
                           "--prefill-tokens", "512", "--out", str(out))
    assert "## prefill" in stdout
    kinds = [r["kind"] for r in json.loads(out.read_text())["rows"]]
    assert "decode" in kinds and "prefill" in kinds


def test_serve_throughput(tmp_path, tiny_folder):
    """Workload 4's script: the offline LLM, the async Engine and the real server with two client
    processes, every path detokenizing with a real tokenizer."""
    out = tmp_path / "w4.json"
    stdout = run_benchmark("serve_throughput", "--model", "tiny", "--device", "cpu", "--num-requests", "8",
                           "--max-input-len", "120", "--max-output-len", "110", "--clients", "2",
                           "--tokenizer", str(tiny_folder), "--out", str(out))
    assert [row[0] for row in last_table(stdout, "path")] == ["offline", "engine", "server"]
    result = json.loads(out.read_text())
    for path in ("offline", "engine", "server"):
        assert "error" not in result["results"][path], result["results"][path]
        assert result["results"][path]["output_tokens"] == result["output_tokens"], path


def test_serve_throughput_through_ray_serve(tmp_path, tiny_folder):
    """The Ray Serve form: two engine replicas behind ``serve --ray`` beside the single server; every
    output token arrives through the replicas (the tokens match the workload's)."""
    pytest.importorskip("ray.serve")
    out = tmp_path / "ray.json"
    stdout = run_benchmark("serve_throughput", "--model", "tiny", "--device", "cpu", "--modes", "server",
                           "--ray-replicas", "2", "--ray-ingress-replicas", "1", "--num-requests", "8",
                           "--max-input-len", "120", "--max-output-len", "110", "--clients", "2",
                           "--tokenizer", str(tiny_folder), "--timeout", "240", "--out", str(out))
    assert [row[0] for row in last_table(stdout, "path")] == ["server", "ray-2"]
    result = json.loads(out.read_text())
    for path in ("server", "ray-2"):
        assert "error" not in result["results"][path], result["results"][path]
        assert result["results"][path]["output_tokens"] == result["output_tokens"], path


def test_serve_throughput_null_runner(tmp_path):
    """The host-cost form: the model replaced by a 2 ms sleep, the server path alone."""
    out = tmp_path / "null.json"
    stdout = run_benchmark("serve_throughput", "--model", "tiny", "--device", "cpu", "--null-runner-ms", "2",
                           "--modes", "server", "--num-requests", "8", "--max-input-len", "120",
                           "--max-output-len", "110", "--clients", "2", "--out", str(out))
    assert [row[0] for row in last_table(stdout, "path")] == ["server"]
    server = json.loads(out.read_text())["results"]["server"]
    assert "error" not in server and server["output_tokens"] > 0 and server["cpu_s"], server


def test_loadtest_against_a_server(tmp_path, tiny_folder):
    """Workload 4's load generator, closed loop at two concurrency levels, against the real server."""
    env = {"AIOINFER_MODEL": str(tiny_folder), "AIOINFER_DEVICE": "cpu", "AIOINFER_DTYPE": "float32",
           "AIOINFER_MAX_MODEL_LEN": "256", "AIOINFER_NUM_KV_BLOCKS": "64"}
    out = tmp_path / "loadtest.json"
    with run_server(env, tmp_path) as server:
        model = httpx.get(server.url + "/v1/models", timeout=10).json()["data"][0]["id"]
        proc = subprocess.run(
            [sys.executable, "-m", "loadtest.loadtest", "--url", server.url, "--model", model, "--concurrency", "1,4",
             "--num-requests", "4", "--prompt-len", "8:16", "--output-len", "4:8", "--vocab-size", "400",
             "--out", str(out), "-q"],
            cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1].split()[0] == "c4", proc.stdout[-2000:]  # its table, a row a level
    levels = json.loads(out.read_text())["levels"]
    assert len(levels) == 2
    assert all(lv["summary"]["num_ok"] == 4 and lv["summary"]["output_tokens"] > 0 for lv in levels), levels


def test_structured_output_rounds(tmp_path, tiny_folder):
    out = tmp_path / "so.json"
    stdout = run_benchmark("structured_output_rounds", "--model", "tiny", "--device", "cpu", "--tokenizer",
                           str(tiny_folder), "--rounds", "1", "--num-requests", "4", "--max-input-len", "150",
                           "--max-output-len", "120", "--out", str(out))
    assert [row[0] for row in last_table(stdout, "form")] == ["constrained", "free"]
    summary = json.loads(out.read_text())["summary"]
    assert summary["constrained"]["rejected_tokens"] == 0 and summary["constrained"]["tok_per_s_median"] > 0


def test_spec_decode(tmp_path, smollm2_gguf):
    """A real model (n-gram drafts need real text); batch 1, one prompt, 16 tokens, off then on."""
    out = tmp_path / "spec.json"
    stdout = run_benchmark("spec_decode", "--model", str(smollm2_gguf), "--device", "cpu", "--batches", "1",
                           "--num-prompts", "1", "--max-tokens", "16", "--out", str(out))
    assert [row[0] for row in last_table(stdout, "batch", trailing_lines=1)] == ["1"]
    assert stdout.strip().splitlines()[-1].startswith("identical outputs:")
    result = json.loads(out.read_text())
    assert [r["batch"] for r in result["results"]] == [1]
    assert result["results"][0]["off"]["tokens"] == result["results"][0]["on"]["tokens"] == 16
