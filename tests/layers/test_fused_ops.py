"""Fused Triton RMSNorm (+ residual add) and rotary kernels against the layers' torch paths.

On a machine without CUDA but with triton, this module turns on the Triton interpreter
(TRITON_INTERPRET=1, before any kernel is defined) and runs a reduced parametrization on CPU
tensors; the full parametrization is marked `gpu`. CI installs no triton: everything skips.

Oracle: the torch code the layers run on CPU (aioinfer.layers.torch_ops.rms_norm_torch,
aioinfer.layers.torch_ops.apply_rotary), on the same device and dtype. Tolerances, in units in the
last place of the output dtype (ulp), elementwise:
  GPU:  residual sum and rotary: bit-exact (same per-op rounding, FMA contraction off);
        normed output fp16/bf16 <= 2 ulp (only the fp32 mean/rsqrt differ, ~1e-7 relative: a value
        on a rounding boundary flips by 1 ulp, which the weight multiply can make 2), and at most
        1% of elements differ at all; fp32 within rtol 2e-6 (~16 ulp).
  Interpreter: as the GPU, except bf16, which the interpreter rounds by truncation rather than
        round-to-nearest-even (triton/runtime/interpreter.py, cast_impl): <= 1 ulp for the residual
        sum, <= 4 ulp for the normed output, and for rotary (where x*cos + rot(x)*sin can cancel)
        an absolute 0.1 on N(0,1) inputs (3 roundings of 1 ulp of bf16 at |x| < 8).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    # Must precede the first @triton.jit of our kernels (decided at decoration time).
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from aioinfer.layers import norm as norm_mod  # noqa: E402
from aioinfer.layers import rotary as rotary_mod  # noqa: E402
from aioinfer.layers.norm import RMSNorm  # noqa: E402
from aioinfer.layers.rotary import apply_rotary_qk  # noqa: E402
from aioinfer.layers.triton_ops import fused_ops  # noqa: E402
from aioinfer.layers.triton_ops.rms_norm import (  # noqa: E402
    _rms_norm_kernel,
    fused_add_rms_norm,
    fused_add_rms_norm_reference,
    rms_norm,
    rms_norm_reference,
)
from aioinfer.layers.triton_ops.rotary import apply_rotary_inplace, apply_rotary_reference  # noqa: E402

_interpreted = type(_rms_norm_kernel).__name__ == "InterpretedFunction"
interp = pytest.mark.skipif(
    CUDA or not _interpreted, reason="interpreter tests run only on CPU-only machines (GPU runs the full set)"
)
DEV = "cuda" if CUDA else "cpu"
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
DT_IDS = ["fp32", "fp16", "bf16"]
EPS = 1e-6
# (num_heads, num_kv_heads, head_dim): Qwen2.5-0.5B and Qwen2.5-7B attention shapes.
GQA = [(14, 2, 64), (28, 4, 128)]
GQA_IDS = ["14q2kv-d64", "28q4kv-d128"]
_TRUNCATING_BF16 = _interpreted  # the interpreter truncates fp32 -> bf16


# ----------------------------------------------------------------------------------- helpers


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise distance in representable values (0 = bit-equal up to the sign of zero)."""
    assert a.dtype == b.dtype and a.shape == b.shape
    itype, bits = (torch.int32, 32) if a.dtype == torch.float32 else (torch.int16, 16)

    def ordered(t):  # sign-magnitude -> monotone integers
        i = t.contiguous().view(itype).to(torch.int64)
        return torch.where(i < 0, -(i & ((1 << (bits - 1)) - 1)), i)

    return (ordered(a) - ordered(b)).abs()


def _assert_exact(out, ref, dtype, name):
    max_ulp = 1 if (dtype == torch.bfloat16 and _TRUNCATING_BF16) else 0
    d = ulp_distance(out, ref)
    assert int(d.max()) <= max_ulp, f"{name}: max {int(d.max())} ulp (allowed {max_ulp})"


def _assert_normed(out, ref, dtype, name):
    assert not out.isnan().any()
    if dtype == torch.float32:
        torch.testing.assert_close(out, ref, rtol=2e-6, atol=1e-6, msg=lambda m: f"{name}: {m}")
        return
    d = ulp_distance(out, ref)
    max_ulp = 4 if (dtype == torch.bfloat16 and _TRUNCATING_BF16) else 2
    assert int(d.max()) <= max_ulp, f"{name}: max {int(d.max())} ulp (allowed {max_ulp})"
    if not (dtype == torch.bfloat16 and _TRUNCATING_BF16):
        assert (d > 0).float().mean().item() <= 0.01, f"{name}: {(d > 0).float().mean().item():.3%} elements differ"


def _check_norm(dtype, hidden, num_tokens, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed * 1000 + hidden + num_tokens)
    # x: rows of a wider buffer (strided), residual contiguous; magnitudes like a real residual stream.
    buf = (3 * torch.randn(num_tokens, hidden + 32, generator=g, device=DEV)).to(dtype)
    x = buf[:, 16 : 16 + hidden]
    residual = (5 * torch.randn(num_tokens, hidden, generator=g, device=DEV)).to(dtype)
    weight = (1 + 0.2 * torch.randn(hidden, generator=g, device=DEV)).to(dtype)
    x_before, res_before = x.clone(), residual.clone()

    out = rms_norm(x, weight, EPS)
    assert out.shape == x.shape and out.is_contiguous()
    _assert_normed(out, rms_norm_reference(x, weight, EPS), dtype, "rms_norm")

    out, new_res = fused_add_rms_norm(x, residual, weight, EPS)
    ref_out, ref_res = fused_add_rms_norm_reference(x, residual, weight, EPS)
    _assert_exact(new_res, ref_res, dtype, "residual sum")
    # Compare the norm on the kernel's own sum, so a 1-ulp (interpreter) sum difference isn't doubled.
    _assert_normed(out, rms_norm_reference(new_res, weight, EPS), dtype, "fused_add_rms_norm")
    if not (dtype == torch.bfloat16 and _TRUNCATING_BF16):
        _assert_normed(out, ref_out, dtype, "fused_add_rms_norm vs torch path")
    assert torch.equal(x, x_before) and torch.equal(residual, res_before)  # inputs untouched


def _check_head_norm(dtype, num_heads, num_kv_heads, head_dim, num_tokens):
    """Per-head q/k norm (Qwen3) on [T, H, D] strided views of a fused qkv buffer."""
    g = torch.Generator(device=DEV).manual_seed(num_tokens + head_dim)
    qkv = torch.randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_dim, generator=g, device=DEV).to(dtype)
    q = qkv[:, : num_heads * head_dim].view(num_tokens, num_heads, head_dim)
    k = qkv[:, num_heads * head_dim : (num_heads + num_kv_heads) * head_dim].view(num_tokens, num_kv_heads, head_dim)
    weight = (1 + 0.2 * torch.randn(head_dim, generator=g, device=DEV)).to(dtype)
    for name, t in (("q", q), ("k", k)):
        _assert_normed(rms_norm(t, weight, EPS), rms_norm_reference(t, weight, EPS), dtype, f"head norm {name}")


def _rope_cos_sin(num_tokens, rot_dim, dtype, g):
    # HF layout: cat(freqs, freqs); large positions so the angles cover many periods.
    positions = torch.randint(0, 32768, (num_tokens,), generator=g, device=DEV).to(torch.float32)
    inv_freq = 1.0 / (1e6 ** (torch.arange(0, rot_dim, 2, device=DEV, dtype=torch.float32) / rot_dim))
    freqs = positions[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _check_rotary(dtype, num_heads, num_kv_heads, head_dim, num_tokens, partial=1.0, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed * 1000 + num_tokens + head_dim)
    rot_dim = int(head_dim * partial)
    qkv = torch.randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_dim, generator=g, device=DEV).to(dtype)
    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
    q = qkv[:, :q_size].view(num_tokens, num_heads, head_dim)  # strided views, as in the model
    k = qkv[:, q_size : q_size + kv_size].view(num_tokens, num_kv_heads, head_dim)
    v_before = qkv[:, q_size + kv_size :].clone()
    cos, sin = _rope_cos_sin(num_tokens, rot_dim, dtype, g)
    ref_q, ref_k = apply_rotary_reference(q, k, cos, sin)
    out_q, out_k = apply_rotary_inplace(q, k, cos, sin)
    assert out_q.data_ptr() == q.data_ptr() and out_k.data_ptr() == k.data_ptr()  # in place
    for name, out, ref in (("q", q, ref_q), ("k", k, ref_k)):
        if dtype == torch.bfloat16 and _TRUNCATING_BF16:  # truncated products: absolute error, not ulp
            torch.testing.assert_close(out.float(), ref.float(), rtol=0, atol=0.1, msg=lambda m: f"rotary {name}: {m}")
        else:
            d = ulp_distance(out, ref)
            assert int(d.max()) == 0, f"rotary {name}: max {int(d.max())} ulp (must be bit-exact)"
        if rot_dim < head_dim:  # the pass-through tail is untouched, bit for bit
            assert torch.equal(out[..., rot_dim:], ref[..., rot_dim:])
    assert torch.equal(qkv[:, q_size + kv_size :], v_before)  # v is never written


# ---------------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("num_tokens", [1, 7, 300, 4099])
@pytest.mark.parametrize("hidden", [64, 896, 3584])
@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
def test_gpu_rms_norm(dtype, hidden, num_tokens):
    _check_norm(dtype, hidden, num_tokens)


@pytest.mark.gpu
@pytest.mark.parametrize("num_tokens", [1, 7, 300])
@pytest.mark.parametrize("heads", GQA, ids=GQA_IDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
def test_gpu_head_norm(dtype, heads, num_tokens):
    _check_head_norm(dtype, *heads, num_tokens)


@pytest.mark.gpu
@pytest.mark.parametrize("partial", [1.0, 0.5], ids=["full", "partial"])
@pytest.mark.parametrize("num_tokens", [1, 7, 300, 4099])
@pytest.mark.parametrize("heads", GQA, ids=GQA_IDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
def test_gpu_rotary(dtype, heads, num_tokens, partial):
    _check_rotary(dtype, *heads, num_tokens, partial)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_gpu_layers_take_fused_path(dtype, monkeypatch):
    """On CUDA the layers call the kernels (spied) and agree with their own torch path."""
    calls = []
    ops = fused_ops()
    assert ops is not None
    spy = type(ops)(**{n: (lambda f, n=n: lambda *a: calls.append(n) or f(*a))(f) for n, f in vars(ops).items()})
    monkeypatch.setattr(norm_mod, "fused_ops", lambda: spy)
    monkeypatch.setattr(rotary_mod, "fused_ops", lambda: spy)
    g = torch.Generator(device="cuda").manual_seed(1)
    layer = RMSNorm(896, EPS).to("cuda", dtype)
    layer.weight.data.copy_(1 + 0.2 * torch.randn(896, generator=g, device="cuda"))
    x = torch.randn(5, 896, generator=g, device="cuda").to(dtype)
    res = torch.randn(5, 896, generator=g, device="cuda").to(dtype)
    out, s = layer(x, res)
    _assert_normed(layer(x), layer._norm(x), dtype, "layer rms_norm")
    _assert_exact(s, x + res, dtype, "layer residual")
    _assert_normed(out, layer._norm(x + res), dtype, "layer fused_add_rms_norm")
    qkv = torch.randn(5, 18 * 64, generator=g, device="cuda").to(dtype)
    q, k = qkv[:, :896].view(5, 14, 64), qkv[:, 896:1024].view(5, 2, 64)
    cos, sin = _rope_cos_sin(5, 64, dtype, g)
    ref = apply_rotary_reference(q, k, cos, sin)
    got = apply_rotary_qk(q, k, cos, sin)
    assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
    assert calls == ["fused_add_rms_norm", "rms_norm", "apply_rotary_inplace"]


@pytest.mark.gpu
def test_gpu_cuda_graph_replay():
    """Both kernels captured in a CUDA graph, replayed on new data in the same buffers."""
    dtype, n, hidden = torch.bfloat16, 8, 896
    g = torch.Generator(device="cuda").manual_seed(2)
    x = torch.randn(n, hidden, generator=g, device="cuda").to(dtype)
    res = torch.randn(n, hidden, generator=g, device="cuda").to(dtype)
    w = (1 + 0.2 * torch.randn(hidden, generator=g, device="cuda")).to(dtype)
    qkv = torch.randn(n, 18 * 64, generator=g, device="cuda").to(dtype)
    cos, sin = _rope_cos_sin(n, 64, dtype, g)

    def step():
        out, s = fused_add_rms_norm(x, res, w, EPS)
        q, k = qkv[:, :896].view(n, 14, 64), qkv[:, 896:1024].view(n, 2, 64)
        apply_rotary_inplace(q, k, cos, sin)
        return out, s

    step()  # compile outside the graph
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, s = step()
    for seed in (3, 4):
        g.manual_seed(seed)
        x.copy_(torch.randn(n, hidden, generator=g, device="cuda"))
        res.copy_(torch.randn(n, hidden, generator=g, device="cuda"))
        qkv.copy_(torch.randn(n, 18 * 64, generator=g, device="cuda"))
        c2, s2 = _rope_cos_sin(n, 64, dtype, g)
        cos.copy_(c2), sin.copy_(s2)
        q0, k0 = qkv[:, :896].view(n, 14, 64).clone(), qkv[:, 896:1024].view(n, 2, 64).clone()
        ref_out, ref_s = fused_add_rms_norm_reference(x, res, w, EPS)
        ref_q, ref_k = apply_rotary_reference(q0, k0, cos, sin)
        graph.replay()
        torch.cuda.synchronize()
        _assert_exact(s, ref_s, dtype, "graph residual")
        _assert_normed(out, ref_out, dtype, "graph norm")
        assert torch.equal(qkv[:, :896].view(n, 14, 64), ref_q) and torch.equal(qkv[:, 896:1024].view(n, 2, 64), ref_k)


# ------------------------------------------------------------------ CPU interpreter (reduced)


@interp
@pytest.mark.parametrize("num_tokens", [1, 7])
@pytest.mark.parametrize("hidden", [64, 896, 3584])
@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
def test_interp_rms_norm(dtype, hidden, num_tokens):
    _check_norm(dtype, hidden, num_tokens)


@interp
@pytest.mark.parametrize("dtype,hidden", [(torch.bfloat16, 896), (torch.float32, 3584)], ids=["bf16-896", "fp32-3584"])
def test_interp_rms_norm_many_tokens(dtype, hidden):
    _check_norm(dtype, hidden, 300)


@interp
@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
def test_interp_head_norm(dtype):
    _check_head_norm(dtype, 14, 2, 64, 7)


@interp
@pytest.mark.parametrize("partial", [1.0, 0.5], ids=["full", "partial"])
@pytest.mark.parametrize("num_tokens", [1, 7])
@pytest.mark.parametrize("heads", GQA, ids=GQA_IDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
def test_interp_rotary(dtype, heads, num_tokens, partial):
    _check_rotary(dtype, *heads, num_tokens, partial)


@interp
@pytest.mark.parametrize(
    "dtype,heads", [(torch.bfloat16, GQA[0]), (torch.float16, GQA[1])], ids=["bf16-" + GQA_IDS[0], "fp16-" + GQA_IDS[1]]
)
def test_interp_rotary_many_tokens(dtype, heads):
    _check_rotary(dtype, *heads, 300)


# ------------------------------------------------------------------ wrappers and CPU dispatch


def test_wrappers_reject_bad_arguments():
    x = torch.randn(4, 64, device=DEV)
    w = torch.ones(64, device=DEV)
    with pytest.raises(ValueError, match="expected torch.float16"):
        rms_norm(x.to(torch.float16), w, EPS)  # weight dtype differs
    with pytest.raises(ValueError, match="contiguous"):
        rms_norm(torch.randn(64, 4, device=DEV).t(), w, EPS)
    with pytest.raises(ValueError, match="weight"):
        rms_norm(x, torch.ones(32, device=DEV), EPS)
    with pytest.raises(ValueError, match="residual"):
        fused_add_rms_norm(x, torch.randn(5, 64, device=DEV), w, EPS)
    with pytest.raises(ValueError, match="unsupported"):
        rms_norm(x.double(), w.double(), EPS)
    q, k = torch.randn(3, 4, 64, device=DEV), torch.randn(3, 2, 64, device=DEV)
    cos = sin = torch.randn(3, 64, device=DEV)
    with pytest.raises(ValueError, match="expected"):
        apply_rotary_inplace(q, k.half(), cos, sin)
    with pytest.raises(ValueError, match="contiguous"):
        apply_rotary_inplace(torch.randn(3, 64, 4, device=DEV).transpose(1, 2), k, cos, sin)
    with pytest.raises(ValueError, match="rotary_dim"):
        apply_rotary_inplace(q, k, torch.randn(3, 65, device=DEV), torch.randn(3, 65, device=DEV))
    with pytest.raises(ValueError, match="cos/sin"):
        apply_rotary_inplace(q, k, cos[:2], sin[:2])


def test_cpu_layers_never_call_fused_ops(monkeypatch):
    """CPU tensors keep the pure-torch path (CI and the float32 HF-equality tests depend on it)."""

    def boom():
        raise AssertionError("fused ops reached from a CPU tensor")

    monkeypatch.setattr(norm_mod, "fused_ops", boom)
    monkeypatch.setattr(rotary_mod, "fused_ops", boom)
    layer = RMSNorm(64)
    x, r = torch.randn(3, 64), torch.randn(3, 64)
    assert torch.equal(layer(x), layer._norm(x))
    out, s = layer(x, r)
    assert torch.equal(s, x + r) and torch.equal(out, layer._norm(x + r))
    q, k = torch.randn(3, 4, 32), torch.randn(3, 2, 32)
    cos, sin = torch.randn(3, 32), torch.randn(3, 32)
    got = apply_rotary_qk(q, k, cos, sin)
    ref = apply_rotary_reference(q, k, cos, sin)
    assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])


def test_cpu_forward_does_not_import_triton():
    """The design's rule: CPU code paths never import triton (checked in a fresh interpreter)."""
    code = (
        "import sys, torch\n"
        "from aioinfer.layers.norm import RMSNorm\n"
        "from aioinfer.layers.rotary import apply_rotary_qk\n"
        "import aioinfer.models.decoder\n"
        "n = RMSNorm(8); x = torch.randn(2, 8); n(x); n(x, x)\n"
        "q = torch.randn(2, 2, 8); apply_rotary_qk(q, q[:, :1], torch.randn(2, 8), torch.randn(2, 8))\n"
        "assert 'triton' not in sys.modules, 'triton was imported'\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_disable_env_turns_fused_ops_off(monkeypatch):
    monkeypatch.setenv("AIOINFER_DISABLE_FUSED_OPS", "1")
    fused_ops.cache_clear()
    try:
        assert fused_ops() is None
    finally:
        monkeypatch.delenv("AIOINFER_DISABLE_FUSED_OPS")
        fused_ops.cache_clear()
    assert fused_ops() is not None


# ------------------------------------------------------------------------------ SiLU and mul


def _check_silu_and_mul(dtype, inter, num_tokens, seed=0):
    from aioinfer.layers.triton_ops.silu_and_mul import silu_and_mul, silu_and_mul_reference

    g = torch.Generator(device=DEV).manual_seed(seed * 1000 + inter + num_tokens)
    # Rows of a wider buffer (strided rows, as after a slice), values spanning silu's curved region.
    buf = (4 * torch.randn(num_tokens, 2 * inter + 16, generator=g, device=DEV)).to(dtype)
    x = buf[:, 8 : 8 + 2 * inter]
    out = silu_and_mul(x)
    ref = silu_and_mul_reference(x)
    assert out.shape == (num_tokens, inter) and out.is_contiguous()
    if dtype == torch.float32:
        torch.testing.assert_close(out, ref, rtol=2e-6, atol=1e-6)
        return
    # Allowed: 1 ulp (a different FMA contraction); under the interpreter, which truncates to bf16
    # twice (silu, then the product), 3.
    max_ulp = 3 if (dtype == torch.bfloat16 and _TRUNCATING_BF16) else 1
    d = ulp_distance(out, ref)
    assert int(d.max()) <= max_ulp, f"max {int(d.max())} ulp"
    if not _TRUNCATING_BF16:
        assert (d > 0).float().mean().item() <= 0.001


@pytest.mark.gpu
@pytest.mark.parametrize("num_tokens", [1, 7, 300, 4099])
@pytest.mark.parametrize("inter", [128, 4864, 18944])
@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
def test_gpu_silu_and_mul(dtype, inter, num_tokens):
    _check_silu_and_mul(dtype, inter, num_tokens)


@pytest.mark.gpu
def test_gpu_mlp_layer_takes_fused_silu(monkeypatch):
    from aioinfer.layers import activation as act_mod

    calls = []
    ops = fused_ops()
    spy = type(ops)(**{**vars(ops), "silu_and_mul": lambda x: calls.append(1) or ops.silu_and_mul(x)})
    monkeypatch.setattr(act_mod, "fused_ops", lambda: spy)
    x = torch.randn(3, 256, device="cuda", dtype=torch.bfloat16)
    torch.testing.assert_close(act_mod.SiluAndMul()(x), act_mod.silu_and_mul_torch(x), rtol=0, atol=0)
    assert calls == [1]


@interp
@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
def test_interp_silu_and_mul(dtype):
    _check_silu_and_mul(dtype, 4864, 3)
