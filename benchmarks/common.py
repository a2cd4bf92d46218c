"""Shared pieces of the benchmarks: model shapes, dummy model folders, the workloads of
benchmarks/README.md, in-run ceilings (copy bandwidth, bf16 matrix rate) and the floors.

Nothing here imports aioinfer or transformers at module load, so the child processes that run
one system each start lean.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import random
import subprocess
import sys
import uuid
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Optional, Sequence

GB = 1e9


@dataclass(frozen=True, slots=True)
class ModelShape:
    name: str
    layers: int
    hidden: int
    heads: int  # query heads
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    max_position: int = 32768
    linear_bytes: int = 2  # bytes per parameter of the decoder layers' matrices (1 with FP8 weights)
    kv_bytes: int = 2  # bytes per KV element (1 with an FP8 KV cache)

    @property
    def layer_params(self) -> int:
        """Parameters of one decoder layer (qkv with bias, o, gate/up/down, two norms)."""
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        qkv = h * (q + 2 * kv) + (q + 2 * kv)
        return qkv + q * h + 3 * h * self.intermediate + 2 * h

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def params(self) -> int:
        """All parameters (a tied lm_head counted once)."""
        lm_head = 0 if self.tied else self.embedding_params
        return self.layers * self.layer_params + self.embedding_params + lm_head + self.hidden

    @property
    def weight_bytes(self) -> int:
        """bf16 bytes of all parameters."""
        return 2 * self.params

    @property
    def decode_weight_bytes(self) -> int:
        """Bytes a decode step must read: every matrix (``linear_bytes`` each), the lm_head in full
        (bf16: FP8 formats leave it unquantized); an untied input embedding only contributes the
        gathered rows, which are negligible and left out."""
        return self.linear_bytes * self.layers * self.layer_params + 2 * (self.embedding_params + self.hidden)

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.kv_bytes  # K and V

    def hf_config(self) -> dict[str, Any]:
        return {
            "architectures": ["Qwen2ForCausalLM"],
            "model_type": "qwen2",
            "hidden_size": self.hidden,
            "intermediate_size": self.intermediate,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab,
            "tie_word_embeddings": self.tied,
            "max_position_embeddings": self.max_position,
            "max_window_layers": self.layers,
            "use_sliding_window": False,
            "sliding_window": None,
            "rope_theta": 1000000.0,
            "rms_norm_eps": 1e-6,
            "hidden_act": "silu",
            "attention_dropout": 0.0,
            "initializer_range": 0.02,
            "torch_dtype": "bfloat16",
            "dtype": "bfloat16",
            "use_cache": True,
            # No eos_token_id / bos_token_id: the workloads ignore EOS, and the peers then have no
            # EOS to stop on either.
        }


SHAPES: dict[str, ModelShape] = {
    "qwen2.5-0.5b": ModelShape("qwen2.5-0.5b", 24, 896, 14, 2, 64, 4864, 151936, True),
    "qwen2.5-7b": ModelShape("qwen2.5-7b", 28, 3584, 28, 4, 128, 18944, 152064, False),
    "qwen2.5-14b": ModelShape("qwen2.5-14b", 48, 5120, 40, 8, 128, 13824, 152064, False),
    # For smoke-testing the scripts on a CPU only; never a reported number.
    "tiny": ModelShape("tiny", 2, 64, 4, 2, 16, 128, 1000, True, max_position=4096),
}


def write_dummy_model(shape: ModelShape, root: str | Path) -> Path:
    """A folder with config.json alone, for ``load_format="dummy"`` (and HF ``from_config``)."""
    folder = Path(root) / shape.name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(shape.hf_config(), indent=2))
    return folder


# ----------------------------------------------------------------------------- workloads

@dataclass(frozen=True, slots=True)
class Request:
    prompt: list[int]  # token ids
    max_tokens: int  # output tokens (EOS ignored: exactly this many)


def workload1(num_requests: int = 256, seed: int = 0, max_input_len: int = 1024,
              max_output_len: int = 1024, max_token_id: int = 10000) -> list[Request]:
    """Workload 1 as nano-vllm's bench.py draws it: ``random.seed(0)``, then all prompts (lengths
    uniform in [100, 1024], token ids uniform in [0, 10000]), then all output lengths (uniform in
    [100, 1024]). ``num_requests`` < 256 gives a prefix of the same prompts but not of the same
    output lengths, so peers' subsets are taken with ``[:n]`` of the full list instead."""
    rng = random.Random(seed)
    prompts = [[rng.randint(0, max_token_id) for _ in range(rng.randint(100, max_input_len))]
               for _ in range(num_requests)]
    outputs = [rng.randint(100, max_output_len) for _ in range(num_requests)]
    return [Request(p, o) for p, o in zip(prompts, outputs)]


def workload1_for(shape: "ModelShape", num_requests: int, max_input_len: int, max_output_len: int) -> list[Request]:
    """Workload 1 for a model shape: token ids below 10,000 and inside the shape's vocabulary."""
    return workload1(num_requests=num_requests, max_input_len=max_input_len, max_output_len=max_output_len,
                     max_token_id=min(10000, shape.vocab - 1))


def default_device(requested: Optional[str]) -> str:
    """``--device`` as given, else cuda when there is one, else cpu."""
    import torch

    return requested or ("cuda" if torch.cuda.is_available() else "cpu")


def workload2(batch: int, prompt_len: int = 128, new_tokens: int = 256, seed: int = 0,
              max_token_id: int = 10000) -> list[Request]:
    """Workload 2: ``batch`` prompts of ``prompt_len`` random token ids, ``new_tokens`` each."""
    rng = random.Random(seed + batch)
    return [Request([rng.randint(0, max_token_id) for _ in range(prompt_len)], new_tokens) for _ in range(batch)]


def output_tokens(requests: Sequence[Request]) -> int:
    return sum(r.max_tokens for r in requests)


# ----------------------------------------------------------------------------- ceilings

def measure_copy_bandwidth(nbytes: int = 2 << 30, iters: int = 20) -> float:
    """Device-to-device copy rate in bytes/s, counting bytes read plus bytes written (median)."""
    import torch

    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    times = _time_cuda(lambda: dst.copy_(src), iters)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * nbytes / _median(times)


def measure_matmul_rate(n: int = 8192, iters: int = 20) -> float:
    """bf16 matrix-product rate in FLOP/s on random data (median of ``iters``), rotating 3 operand sets."""
    import torch

    sets = [(torch.randn(n, n, device="cuda", dtype=torch.bfloat16),
             torch.randn(n, n, device="cuda", dtype=torch.bfloat16)) for _ in range(3)]
    out = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    state = {"i": 0}

    def step():
        a, b = sets[state["i"] % 3]
        state["i"] += 1
        torch.matmul(a, b, out=out)

    times = _time_cuda(step, iters)
    del sets, out
    torch.cuda.empty_cache()
    return 2 * n ** 3 / _median(times)


def _time_cuda(fn, iters: int, warmup: int = 3) -> list[float]:
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return times


def _median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    return s[len(s) // 2] if len(s) % 2 else 0.5 * (s[len(s) // 2 - 1] + s[len(s) // 2])


def ceilings(measure: bool) -> dict[str, float]:
    """Copy bandwidth and matrix rate measured now (CUDA), or benchmarks/README.md's figures otherwise."""
    if measure:
        return {"copy_bytes_per_s": measure_copy_bandwidth(), "matmul_flop_per_s": measure_matmul_rate(),
                "ceilings_source": "measured in this run"}
    return {"copy_bytes_per_s": 4.27e12, "matmul_flop_per_s": 790e12,
            "ceilings_source": "benchmarks/README.md (not measured: no CUDA)"}


# ----------------------------------------------------------------------------- floors

def decode_step_floor_s(shape: ModelShape, context_lens: Sequence[int], copy_bytes_per_s: float,
                        matmul_flop_per_s: float) -> float:
    """One decode step of ``len(context_lens)`` sequences: weights + KV read over the copy rate,
    or 2 x matrix parameters x tokens over the matrix rate, whichever is larger."""
    read = shape.decode_weight_bytes + shape.kv_bytes_per_token * sum(context_lens)
    flops = 2 * (shape.layers * shape.layer_params + shape.embedding_params) * len(context_lens)
    return max(read / copy_bytes_per_s, flops / matmul_flop_per_s)


def workload_floor(shape: ModelShape, requests: Sequence[Request], copy_bytes_per_s: float,
                   matmul_flop_per_s: float) -> dict[str, float]:
    """A lower bound on the time of a whole offline run.

    - compute: every prompt and output token passes every layer (2 x layer params FLOP each), and
      every output token the lm_head (2 x V x H), over the matrix rate;
    - memory: at least max(output length) decode steps, each reading all weights once (everything
      batched), plus every decode step of every request reading its context's KV once.
    The floor is the larger of the two (they can overlap, so no sum).
    """
    prompt = sum(len(r.prompt) for r in requests)
    out = sum(r.max_tokens for r in requests)
    flops = 2 * shape.layers * shape.layer_params * (prompt + out) + 2 * shape.embedding_params * out
    compute_s = flops / matmul_flop_per_s
    kv_tokens_read = sum(len(r.prompt) * r.max_tokens + r.max_tokens * (r.max_tokens - 1) // 2 for r in requests)
    steps = max(r.max_tokens for r in requests)
    memory_s = (steps * shape.decode_weight_bytes + kv_tokens_read * shape.kv_bytes_per_token) / copy_bytes_per_s
    floor_s = max(compute_s, memory_s)
    return {"floor_s": floor_s, "floor_compute_s": compute_s, "floor_memory_s": memory_s,
            "floor_tok_per_s": out / floor_s, "prompt_tokens": prompt, "output_tokens": out}


# ----------------------------------------------------------------------------- running

def environment() -> dict[str, Any]:
    info: dict[str, Any] = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                            "python": platform.python_version(), "host": platform.node(), "commit": _commit()}
    try:
        import torch

        info["torch"] = torch.__version__
        if torch.cuda.is_available():
            info["device"] = torch.cuda.get_device_name(0)
            info["device_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
        else:
            info["device"] = "cpu"
    except ImportError:
        pass
    for name in ("transformers", "triton"):
        try:
            info[name] = __import__(name).__version__
        except ImportError:
            info[name] = None
    return info


def _commit() -> Optional[str]:
    """The measured tree's commit: $AIOINFER_BENCH_COMMIT (a copy without .git, as on the GPU machine),
    else git's HEAD (with "+dirty" when the tree differs from it), else None."""
    if os.environ.get("AIOINFER_BENCH_COMMIT"):
        return os.environ["AIOINFER_BENCH_COMMIT"]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
                              cwd=Path(__file__).resolve().parent).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, timeout=10, cwd=Path(__file__).resolve().parent).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (head + ("+dirty" if dirty else "")) or None


def run_child(args: list[str], timeout_s: float, env: Optional[dict[str, str]] = None) -> dict[str, Any]:
    """Run ``python -m <args>`` in a fresh process (own CUDA context, memory freed on exit) and return
    the JSON it wrote to the file named by its ``--child-out``; on failure, ``{"error": ...}``. ``env``:
    the child's whole environment (default: this process's)."""
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    cmd = [sys.executable, "-m", *args, "--child-out", path]
    env = dict(os.environ if env is None else env, PYTHONUNBUFFERED="1")
    print("+", " ".join(cmd), flush=True)
    try:
        proc = subprocess.run(cmd, env=env, timeout=timeout_s)
        if proc.returncode != 0:
            return {"error": f"exit code {proc.returncode}"}
        return json.loads(Path(path).read_text())
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout_s:.0f} s"}
    finally:
        Path(path).unlink(missing_ok=True)


def write_child_result(path: Optional[str], result: dict[str, Any]) -> None:
    if path:
        Path(path).write_text(json.dumps(result))


def fresh_cache_salt() -> str:
    """A prefix-cache salt no earlier request used: passed with every timed batch, so that prompts a
    benchmark runs again (warm-up, repeats, the peers' subset) are computed, not served from the cache."""
    return uuid.uuid4().hex


def add_engine_options(parser: Any) -> None:
    """``--engine-option KEY=VALUE`` (repeatable): any other ``LLM`` option, the value read as JSON
    when it parses (``max_cuda_graph_prefill_tokens=0``, ``enable_prefix_caching=false``), else a string."""
    parser.add_argument("--engine-option", action="append", default=[], metavar="KEY=VALUE",
                        help="extra LLM(...) option for aioinfer (repeatable)")
    parser.add_argument("--quantization", default=None, help="both engines: weights' format (fp8)")
    parser.add_argument("--kv-cache-dtype", default=None, help="both engines: the KV cache's type (fp8)")


def with_formats(shape: ModelShape, args: Any) -> ModelShape:
    """The shape as the formats of ``--quantization`` / ``--kv-cache-dtype`` store it, so that the
    floors count the bytes actually read (FP8: one byte per weight of the decoder's matrices, per
    KV element). The layers' norms and biases stay in bf16; their bytes are negligible."""
    options = format_options(args)
    return replace(shape, linear_bytes=1 if options.get("quantization") == "fp8" else 2,
                   kv_bytes=1 if str(options.get("kv_cache_dtype", "auto")).startswith("fp8") else 2)


def format_options(args: Any) -> dict[str, Any]:
    """The options that set the model's formats, given to aioinfer and its vLLM peer alike."""
    return {key: value for key in ("quantization", "kv_cache_dtype")
            if (value := getattr(args, key, None)) is not None}


def format_argv(args: Any) -> list[str]:
    """``format_options`` as the flags of a benchmark's child process."""
    return [item for key, value in format_options(args).items() for item in (f"--{key.replace('_', '-')}", value)]


def engine_options(args: Any) -> dict[str, Any]:
    options: dict[str, Any] = format_options(args)
    for item in getattr(args, "engine_option", None) or ():
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--engine-option wants KEY=VALUE, got {item!r}")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return options


def make_llm(folder: Path | str, device: str, enforce_eager: Optional[bool], attention_backend: Optional[str],
             **kwargs: Any):
    """``LLM(model=folder, load_format="dummy", ...)``; options the engine does not know yet
    (``enforce_eager`` before CUDA graphs land) are dropped with a note instead of failing."""
    from aioinfer import LLM

    opts: dict[str, Any] = dict(load_format="dummy", dtype="bfloat16" if device == "cuda" else "float32",
                                device=device, **kwargs)
    if attention_backend is not None:
        opts["attention_backend"] = attention_backend
    if enforce_eager is not None:
        opts["enforce_eager"] = enforce_eager
    dropped = []
    while True:
        try:
            return LLM(model=str(folder), **opts), dropped
        except TypeError as e:
            unknown = [k for k in ("enforce_eager",) if k in opts and k in str(e)]
            if not unknown:
                raise
            for k in unknown:
                opts.pop(k)
                dropped.append(k)
            print(f"note: engine does not accept {unknown}; running without", flush=True)


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [[_fmt(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |" for r in cells]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def _fmt(x: Any) -> str:
    if isinstance(x, float):
        if x == 0 or abs(x) >= 100:
            return f"{x:,.0f}"
        if abs(x) >= 1:
            return f"{x:.2f}"
        return f"{x:.3g}"
    return "" if x is None else str(x)


def dump(path: Optional[str], payload: dict[str, Any]) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(payload, indent=2, default=lambda o: asdict(o)))
        print(f"wrote {path}", flush=True)
