"""FP8 weights on the GPU: each kernel and GEMM path against its torch reference, and an engine run
with CUDA graphs.

Oracles (float64 products of the very FP8 values the path feeds its GEMM, so that only the GEMM's
own rounding is left):
- the per-token and per-tensor quantization kernels equal ``quantize_rows`` / ``quantize_tensor``
  (scales bit-exact, e4m3 values equal except for rare round-half cases, which must be one e4m3
  step apart);
- the small-batch kernel with FP8 weights (weight-only: 1-8 rows) against x @ dequantized(W)^T;
- the row-wise ``torch._scaled_mm`` path (per-channel weights, 9+ rows) against
  dequantized(quantize_rows(x)) @ dequantized(W)^T;
- the tensor-wise path (online weights, 2+ rows) against dequantized(quantize_tensor(x)) @
  dequantized(W)^T, with the bias in the GEMM's epilogue;
- block-wise weights (128 x 128, ``F.scaled_mm``) against per-(token, 128 columns) quantized
  activations times the dequantized weights.
Tolerance: 1 % of the output's scale (bf16 output rounding), 2 % where ``torch._scaled_mm`` sums
K > 8192 products with ``use_fast_accum`` (Hopper's FP8 tensor cores then keep fewer bits in the
running sum: 1.07 % was seen at the 7b down matrix, K = 18944, 256 rows, on an H100).
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)
if torch.cuda.get_device_capability() < (8, 9):
    pytest.skip("FP8 GEMMs need compute capability 8.9+", allow_module_level=True)

from aioinfer.layers.linear import MergedLinear, RowParallelLinear  # noqa: E402
from aioinfer.layers.quantization.config import QuantConfig  # noqa: E402
from aioinfer.layers.quantization.fp8 import (FP8, dequantize_blocks, dequantize_rows, quantize_blocks,  # noqa: E402
                                              quantize_rows, quantize_tensor)
from aioinfer.layers.quantization.fp8_linear import Fp8Linear  # noqa: E402
from aioinfer.layers.triton_ops.fp8_quant import quantize_fp8_rows, quantize_fp8_tensor  # noqa: E402

DEV = "cuda"
SHAPES = [(4608, 3584), (37888, 3584), (3584, 18944), (1152, 896)]  # (N, K): 7b qkv, 7b gate_up, 7b down, 0.5b qkv


def _close(got: torch.Tensor, ref: torch.Tensor, rel: float = 1e-2) -> None:
    err = (got.double() - ref).abs().max().item()
    scale = ref.abs().max().item()
    assert err <= rel * scale, f"max error {err:.3g} against a scale of {scale:.3g}"


@pytest.mark.parametrize("rows", [1, 7, 300])
@pytest.mark.parametrize("k", [64, 3584, 18944])
def test_token_quantization_kernel_equals_the_reference(rows, k):
    x = (3 * torch.randn(rows, k, device=DEV)).to(torch.bfloat16)
    x[0, :5] = torch.tensor([0.0, 1e-3, -900.0, 448.0, 65504.0 / 256], dtype=torch.bfloat16)
    q, s = quantize_fp8_rows(x)
    rq, rs = quantize_rows(x)
    assert torch.equal(s, rs)
    differ = q.view(torch.uint8) != rq.view(torch.uint8)
    assert differ.float().mean().item() < 1e-3
    # where they differ: one e4m3 step (a tie rounded the other way)
    assert ((q.float() - rq.float()).abs() <= (rq.float().abs() / 8).clamp(min=2.0**-9))[differ].all()


@pytest.mark.parametrize("rows", [1, 7, 300, 8192])
@pytest.mark.parametrize("k", [64, 3584, 18944])
def test_tensor_quantization_kernel_equals_the_reference(rows, k):
    x = (3 * torch.randn(rows, k, device=DEV)).to(torch.bfloat16)
    x[-1, :5] = torch.tensor([0.0, 1e-3, -900.0, 448.0, 65504.0 / 256], dtype=torch.bfloat16)
    q, s = quantize_fp8_tensor(x)
    rq, rs = quantize_tensor(x)
    assert s.shape == () and torch.equal(s, rs)
    differ = q.view(torch.uint8) != rq.view(torch.uint8)
    assert differ.float().mean().item() < 1e-3
    assert ((q.float() - rq.float()).abs() <= (rq.float().abs() / 8).clamp(min=2.0**-9))[differ].all()
    # padding rows (slot -1) are left out of the scale: the real rows quantize as they would alone
    slots = torch.arange(rows, device=DEV)
    slots[-1] = -1
    _, padded_scale = quantize_fp8_tensor(x, slots)
    if rows > 1:
        assert torch.equal(padded_scale, quantize_tensor(x[:-1])[1])


def _layer(n: int, k: int, bias: bool, config: QuantConfig, merged: bool = True):
    with torch.device("meta"):
        layer = MergedLinear(k, [n], bias=bias) if merged else RowParallelLinear(k, n, bias=bias)
    layer = layer.to(torch.bfloat16)  # as the loader builds it: activation dtype first, then FP8
    layer.quant = Fp8Linear(layer, config, "test")
    layer.to_empty(device=DEV)
    w = torch.randn(n, k, device=DEV) / k**0.5
    layer.weight_loader(layer.weight, w, 0 if merged else None)
    if bias:
        layer.bias.copy_((0.5 * torch.randn(n, device=DEV)).to(torch.bfloat16))
    layer.quant.finish(layer)
    return layer


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("rows", [1, 2, 8, 9, 64, 256])
def test_channel_fp8_linear_matches_its_dequantized_reference(n, k, rows):
    layer = _layer(n, k, bias=True, config=QuantConfig(source="online"))
    assert layer.weight.dtype == FP8 and layer.weight_scale.shape == (n,)
    x = torch.randn(rows, k, device=DEV).to(torch.bfloat16)
    got = layer(x)
    assert got.dtype == torch.bfloat16 and got.shape == (rows, n)
    w = dequantize_rows(layer.weight, layer.weight_scale).double()
    xin = x.double() if rows <= 8 else dequantize_rows(*quantize_rows(x)).double()  # weight-only at <= 8 rows
    _close(got, xin @ w.T + layer.bias.double(), rel=2e-2 if rows > 8 and k > 8192 else 1e-2)


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("rows", [1, 2, 8, 9, 64, 256, 2048])
def test_online_tensor_fp8_linear_matches_its_dequantized_reference(n, k, rows):
    layer = _layer(n, k, bias=True, config=QuantConfig(source="online", weights="tensor"))
    assert (layer.weight_scale == layer.weight_scale[0]).all()
    x = torch.randn(rows, k, device=DEV).to(torch.bfloat16)
    got = layer(x)
    assert got.dtype == torch.bfloat16 and got.shape == (rows, n)
    w = dequantize_rows(layer.weight, layer.weight_scale).double()
    if rows == 1 or (rows <= 8 and n >= 4 * k):  # weight-only (one row; a wide projection up to 8)
        xin = x.double()
    else:
        q, s = quantize_tensor(x)
        xin = q.double() * s.double()
    _close(got, xin @ w.T + layer.bias.double(), rel=2e-2 if rows > 1 and k > 8192 else 1e-2)


@pytest.mark.parametrize("rows", [1, 16, 200])
def test_static_activation_scale_path(rows):
    layer = _layer(1024, 2048, bias=False, config=QuantConfig(source="compressed-tensors", activations="static"),
                   merged=False)
    layer.weight_loader(layer.input_scale, torch.tensor(0.01))
    x = torch.randn(rows, 2048, device=DEV).to(torch.bfloat16)
    got = layer(x)
    w = dequantize_rows(layer.weight, layer.weight_scale).double()
    xin = x.double() if rows <= 8 else ((x.float() / 0.01).clamp(-448, 448).to(FP8).double() * 0.01)
    _close(got, xin @ w.T)


@pytest.mark.parametrize("n,k", SHAPES)  # the 0.5b shape's 7 K blocks are padded to 8 for cuBLASLt
@pytest.mark.parametrize("rows", [1, 3, 64, 301])  # token counts padded to a multiple of 4 too
def test_block_fp8_linear_matches_its_dequantized_reference(n, k, rows):
    layer = _layer(n, k, bias=False, config=QuantConfig(source="fp8", weights="block", block=(128, 128)))
    w = dequantize_blocks(layer.weight, layer.weight_scale_inv, (128, 128)).double()
    x = torch.randn(rows, k, device=DEV).to(torch.bfloat16)
    got = layer(x)
    groups = x.reshape(rows * k // 128, 128)
    xin = dequantize_rows(*quantize_rows(groups)).reshape(rows, k).double()
    _close(got, xin @ w.T)
    # the stored weights are the block quantization of what was loaded
    q, _ = quantize_blocks(w.float(), (128, 128))
    assert (q.float() == layer.weight.float()).float().mean().item() > 0.999


def test_engine_with_fp8_weights_runs_cuda_graphs_and_eager_alike(tmp_path):
    """Decode through captured CUDA graphs gives the eager steps' tokens (the same kernels run)."""
    from aioinfer import LLM, SamplingParams
    from tiny_models import make_tiny_model_dir

    src = make_tiny_model_dir(tmp_path, "qwen2")
    prompts = [{"prompt_token_ids": p} for p in ([5, 9, 200, 7], [33, 100, 3], list(range(40, 90)))]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    tokens = []
    for eager in (True, False):
        llm = LLM(model=str(src), quantization="fp8", dtype="bfloat16", device="cuda", enforce_eager=eager,
                  gpu_memory_utilization=0.3)
        try:
            layer = llm.engine.loaded.model.model.layers[0].mlp.gate_up_proj
            assert layer.weight.dtype == FP8
            tokens.append([o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)])
        finally:
            llm.shutdown()
    assert tokens[0] == tokens[1]
