"""The small-batch linear kernel (layers/triton_ops/small_batch_linear.py) against float64, and the
layers' dispatch to it.

Oracle: the product in float64 of the same (rounded) inputs. The kernel accumulates in float32 and
rounds once, so per output element
  |out - ref| <= ulp_dtype(ref) + 2 * K * 2^-24 * sum_k |x_k w_nk|   (final rounding + fp32 sums).

Without CUDA this runs under the Triton interpreter (TRITON_INTERPRET=1) on CPU tensors (small
shapes, masked tails on both axes); the GPU runs the model shapes (marked gpu).
"""

from __future__ import annotations

import os

import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernel module is imported
pytest.importorskip("triton")

from aioinfer.layers.triton_ops import small_batch_linear as sbl  # noqa: E402

_interpreted = type(sbl._small_batch_linear_kernel).__name__ == "InterpretedFunction"
if not CUDA and not _interpreted:
    pytest.skip("the kernel module was imported without the interpreter", allow_module_level=True)
DEV = "cuda" if CUDA else "cpu"
_UNIT = {torch.float32: 2.0**-23, torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}  # ulp at 1.0


def _check(dtype, m, n, k, bias, config=None, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed * 7919 + m * 31 + n + k)
    # x: rows of a wider buffer (strided rows, as the layers pass views of qkv); residual-stream scale.
    x = (2 * torch.randn(m, k + 16, generator=g, device=DEV)).to(dtype)[:, 8 : 8 + k]
    weight = (torch.randn(n, k, generator=g, device=DEV) / k**0.5).to(dtype)
    b = (0.5 * torch.randn(n, generator=g, device=DEV)).to(dtype) if bias else None
    x_before = x.clone()

    got = sbl.small_batch_linear(x, weight, b, config=config)
    assert got.shape == (m, n) and got.dtype == dtype
    assert torch.equal(x, x_before), "the input must not be modified"
    ref = x.double() @ weight.double().T + (b.double() if b is not None else 0.0)
    tol = _UNIT[dtype] * ref.abs() + 2 * k * 2.0**-24 * (x.double().abs() @ weight.double().abs().T) + 1e-30
    err = (got.double() - ref).abs()
    worst = (err / tol).max().item()
    assert worst <= 1.0, f"max error {err.max().item():.3g}, {worst:.2f}x the tolerance"


interp = pytest.mark.skipif(CUDA, reason="the interpreter set runs on CPU-only machines (the GPU runs the full set)")


@interp
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("m", [1, 3])
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
def test_interpreter(dtype, m, bias):
    # n not a multiple of BLOCK_N, k not a multiple of BLOCK_K: masked tails on both axes.
    _check(dtype, m, n=37, k=300, bias=bias, config=(4, 128, 4))


@interp
@pytest.mark.parametrize("m", [1, 5])
def test_interpreter_tensor_core_variant(m):
    # fp32 only: the interpreter's tl.dot mishandles bf16 operands (attention/triton_ops/_checks.py).
    _check(torch.float32, m, n=37, k=300, bias=True, config=(16, 64, 4, True))


def test_rejects_what_it_cannot_compute():
    w = torch.zeros(8, 16, device=DEV)
    with pytest.raises(ValueError, match="at most"):
        sbl.small_batch_linear(torch.zeros(sbl.MAX_ROWS + 1, 16, device=DEV), w)
    with pytest.raises(ValueError, match=r"\[M, K\]"):
        sbl.small_batch_linear(torch.zeros(1, 15, device=DEV), w)
    with pytest.raises(ValueError, match="bias"):
        sbl.small_batch_linear(torch.zeros(1, 16, device=DEV), w, torch.zeros(7, device=DEV))
    with pytest.raises(ValueError, match="expected"):
        sbl.small_batch_linear(torch.zeros(1, 16, device=DEV), w.half())


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("m", [1, 2, 5, 8])
@pytest.mark.parametrize("shape", [(4608, 3584), (3584, 3584), (3584, 18944), (1152, 896), (896, 4864), (100, 130)],
                         ids=["7b-qkv", "7b-o", "7b-down", "05b-qkv", "05b-down", "odd"])
@pytest.mark.parametrize("variant", ["default", "cuda-cores", "tensor-cores"])
def test_gpu(dtype, m, shape, variant):
    n, k = shape
    config = {"default": None, "cuda-cores": (4, 2048 if m <= 2 else 512, 4, False),
              "tensor-cores": (16, 256, 4, True)}[variant]
    _check(dtype, m, n, k, bias=n % 2 == 0, config=config)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_linear_layers_dispatch_small_batches_to_the_kernel(monkeypatch):
    """1 row: the kernel; 2-8 rows: the kernel only for wide weights (out >= 4 x in); more rows and
    float32: F.linear. Results agree with F.linear either way."""
    from aioinfer.layers import linear as linear_mod
    from aioinfer.layers.linear import Linear
    from aioinfer.layers.triton_ops import fused_ops

    calls = []
    real = sbl.small_batch_linear
    monkeypatch.setattr(fused_ops(), "small_batch_linear",
                        lambda *a, **kw: calls.append((tuple(a[0].shape), tuple(a[1].shape))) or real(*a, **kw))
    narrow = Linear(256, 96, bias=True).to("cuda", torch.bfloat16)
    wide = Linear(128, 1024).to("cuda", torch.bfloat16)
    for layer in (narrow, wide):
        torch.nn.init.normal_(layer.weight, std=0.05)
        if layer.bias is not None:
            torch.nn.init.normal_(layer.bias)
        for rows in (1, 2, 8, 9):
            x = torch.randn(rows, layer.in_features, device="cuda", dtype=torch.bfloat16)
            torch.testing.assert_close(layer(x), torch.nn.functional.linear(x, layer.weight, layer.bias),
                                       rtol=1.6e-2, atol=1e-2)
    Linear(256, 96).to("cuda")(torch.randn(1, 256, device="cuda"))  # float32: cuBLAS
    assert calls == [((1, 256), (96, 256)), ((1, 128), (1024, 128)), ((2, 128), (1024, 128)),
                     ((8, 128), (1024, 128))], calls
    assert (linear_mod.SMALL_BATCH_ROWS, linear_mod.WIDE_BATCH_ROWS) == (1, 8)
