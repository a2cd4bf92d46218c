"""FP8 weights in the decoder's linear layers: their parameters, their loading, their product.

Why here and not in layers/linear.py: the plain layers stay plain. A quantized model is built like
any other (on the meta device), then :func:`quantize_linears` gives each chosen layer an
:class:`Fp8Linear` (``layer.quant``), which swaps its weight for a float8_e4m3fn one and adds the
scales, before the parameters are materialised. The layer then routes its product and its
checkpoint loading through ``layer.quant``; sharding (which rows or columns of a checkpoint tensor
this rank keeps, where a fused projection's piece goes) stays the layer's own.

Tensors (names as the checkpoints store them):
- ``weight`` [N, K] e4m3;
- ``weight_scale`` [N] float32 (per output row; a per-tensor checkpoint scale is spread over its
  rows, so that fused q/k/v or gate/up pieces with scales of their own stay exact); for online
  quantization a buffer, computed as each weight loads, then made one value for the whole layer;
- for block-wise weights a scale per block, [cdiv(N, bn), cdiv(K, bk)] float32: HF names it
  ``weight_scale_inv``, compressed-tensors ``weight_scale``;
- ``input_scale`` [] float32 for static activations (the largest of a fused layer's pieces).

Products on CUDA:
- one row (decode at batch 1) reads the FP8 weights in the small-batch Triton kernel (weight-only:
  the activations stay 16-bit, nothing to quantize); so do 2-8 rows of per-channel weights and of
  wide projections (out >= 4 x in);
- online ("tensor") weights: the activations get one scale per tensor (two Triton kernels), then
  ``torch._scaled_mm`` with tensor-wise scales, cuBLASLt's fastest FP8 GEMM (the 7b down projection
  in 27-37 us where the row-wise-scaled one takes 45-50 at 8-256 rows, docs/performance.md);
- per-channel weights quantize the activations per token (or with the static scale) and run
  ``torch._scaled_mm`` with row-wise scales;
- block-wise weights run ``torch.nn.functional.scaled_mm`` with 1 x 128 / 128 x 128 block scales.
On the CPU the same ``torch._scaled_mm`` runs the tensor- and row-wise products, and block-wise
weights are dequantized for each product (a test path).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from aioinfer.attention.context import current_attention_metadata
from aioinfer.layers.linear import Linear, MergedLinear
from aioinfer.layers.quantization.config import QuantConfig, QuantizationError
from aioinfer.layers.quantization.fp8 import (FP8, dequantize_blocks, quantize_blocks, quantize_rows,
                                              quantize_tensor, requantize_rows, scaled_mm_rows, scaled_mm_tensor)
from aioinfer.layers.triton_ops import fused_ops

# Rows up to which a CUDA product reads the FP8 weights in the small-batch kernel (weight-only).
SMALL_BATCH_ROWS = 8


def quantize_linears(model: nn.Module, config: QuantConfig, device: torch.device) -> int:
    """Give every decoder linear layer of ``model`` (still on the meta device) that ``config``
    quantizes its FP8 parameters. Returns how many layers were quantized."""
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        if (major, minor) < (8, 9):
            raise QuantizationError(f"FP8 weights need a GPU with FP8 matrix units (compute capability 8.9+: "
                                    f"Ada, Hopper, Blackwell); {torch.cuda.get_device_name(device)} is {major}.{minor}")
    count = 0
    for name, module in model.named_modules():
        if isinstance(module, Linear) and config.quantizes(name):
            module.quant = Fp8Linear(module, config, name)
            count += 1
    return count


class Fp8Linear:
    """The FP8 side of one linear layer (``layer.quant``); holds no tensors itself."""

    def __init__(self, layer: Linear, config: QuantConfig, name: str) -> None:
        self.config = config
        self.block = config.block
        self.tensor_wise = config.weights == "tensor"
        self.static = config.activations == "static"
        self.block_scale = "weight_scale_inv" if config.source == "fp8" else "weight_scale"
        n, k = layer.out_features, layer.in_features
        if k % 16 or n % 16:
            raise QuantizationError(f"{name}: FP8 GEMMs need both sizes to be multiples of 16, got {n} x {k}")
        if self.block is not None:
            bn, bk = self.block
            for sizes, unit, what in ((_row_pieces(layer), bn, "output rows"), ((k,), bk, "input columns")):
                if any(size % unit for size in sizes):
                    raise QuantizationError(f"{name}: block-wise FP8 needs this rank's {what} {sizes} in whole "
                                            f"blocks of {unit}")
        weight = layer.weight
        layer.weight = nn.Parameter(torch.empty(n, k, dtype=FP8, device=weight.device), requires_grad=False)
        if self.block is not None:
            bn, bk = self.block
            scale = torch.empty(-(-n // bn), -(-k // bk), dtype=torch.float32, device=weight.device)
            setattr(layer, self.block_scale, nn.Parameter(scale, requires_grad=False))
        elif config.checkpoint_scales:
            layer.weight_scale = nn.Parameter(torch.empty(n, dtype=torch.float32, device=weight.device),
                                              requires_grad=False)
        else:
            layer.register_buffer("weight_scale", torch.empty(n, dtype=torch.float32, device=weight.device))
        if self.static:
            layer.input_scale = nn.Parameter(torch.empty((), dtype=torch.float32, device=weight.device),
                                             requires_grad=False)
        self._input_scales: list[float] = []

    # ------------------------------------------------------------------ loading

    def load(self, layer: Linear, param: torch.Tensor, loaded: torch.Tensor, shard_id) -> bool:
        """Copy one checkpoint tensor into ``param``; False when ``param`` is not an FP8 one (the bias)."""
        if param is layer.weight:
            part = layer.rank_part(loaded, shard_id)
            start, size = layer.rows(shard_id)
            if loaded.dtype == FP8:
                _copy(param, start, size, part)
            elif self.block is not None:  # a float tensor: quantize it now (online, or dummy weights)
                q, scale = quantize_blocks(part, self.block)
                _copy(param, start, size, q)
                _copy(getattr(layer, self.block_scale), start // self.block[0], scale.shape[0], scale)
            else:
                q, scale = quantize_rows(part)
                _copy(param, start, size, q)
                _copy(layer.weight_scale, start, size, scale.reshape(-1))
            return True
        if self.block is not None and param is getattr(layer, self.block_scale):
            bn, bk = self.block
            start, size = layer.rows(shard_id)
            _copy(param, start // bn, size // bn, layer.rank_part(loaded, shard_id, unit=(bn, bk)))
            return True
        if param is getattr(layer, "weight_scale", None):
            start, size = layer.rows(shard_id)
            if loaded.numel() == 1:  # per tensor: one scale for all of this piece's rows
                _copy(param, start, size, loaded.reshape(1).expand(size))
            else:
                _copy(param, start, size, layer.rank_part(loaded.reshape(-1), shard_id))
            return True
        if param is getattr(layer, "input_scale", None):
            self._input_scales.append(float(loaded.reshape(())))
            param.fill_(max(self._input_scales))
            return True
        return False

    def finish(self, layer: Linear) -> None:
        """After the last checkpoint tensor: bring a per-tensor ("tensor") layer's rows to one scale,
        the largest of its rows' (a fused layer's pieces load, and are quantized, one by one)."""
        if self.tensor_wise:
            scale = layer.weight_scale.max()
            layer.weight.data.copy_(requantize_rows(layer.weight, layer.weight_scale, scale))
            layer.weight_scale.fill_(scale)

    # ------------------------------------------------------------------ the product

    def apply(self, layer: Linear, x: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        """``x @ W^T + bias`` for x [T, K] in the activation dtype; returns [T, N] in that dtype."""
        if self.block is not None:
            return self._apply_block(layer, x, bias)
        rows = x.shape[0]
        # Weight-only at one row, and at 2-8 rows for per-channel weights or a wide projection (gate_up:
        # 52 against 55 us tensor-wise at the 7b shape; the down projection 68 against 39, H100).
        wide = layer.out_features >= 4 * layer.in_features
        if x.is_cuda and (rows == 1 or (rows <= SMALL_BATCH_ROWS and (wide or not self.tensor_wise))):
            ops = fused_ops()
            if ops is not None:
                return ops.small_batch_linear(x, layer.weight, bias, weight_scale=layer.weight_scale)
        if self.tensor_wise:
            xq, xs = _quantize_tensor(x, _padding_slots(rows))
            return scaled_mm_tensor(xq, xs, layer.weight, layer.weight_scale[0], bias, x.dtype)
        if self.static and self._input_scales:  # (dummy weights bring no input scale: dynamic then)
            xq, xs = quantize_tensor(x, layer.input_scale)
            xs = xs.expand(x.shape[0], 1).contiguous()
        else:
            xq, xs = _quantize_tokens(x)
        out_dtype = torch.bfloat16 if x.is_cuda else x.dtype  # CUDA's row-wise scaled GEMM writes bf16
        out = scaled_mm_rows(xq, xs, layer.weight, layer.weight_scale, bias, out_dtype)
        return out if out.dtype == x.dtype else out.to(x.dtype)

    def _apply_block(self, layer: Linear, x: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        scale = getattr(layer, self.block_scale)
        if not x.is_cuda:
            w = dequantize_blocks(layer.weight, scale, self.block, x.dtype)  # type: ignore[arg-type]
            return F.linear(x, w, bias)
        # cuBLASLt's block-scaled GEMM (sm_90) reads the activation scales column-major with the
        # token count a multiple of 4, and the weight scales as [K blocks, N blocks] with the K
        # blocks a multiple of 4: pad both (zero rows give zero outputs, cut off below).
        rows = x.shape[0]
        padded = F.pad(x, (0, 0, 0, -rows % 4)) if rows % 4 else x
        xq, xs = _quantize_groups(padded, self.block[1])  # type: ignore[index]
        if scale.shape[1] % 4:
            scale = F.pad(scale, (0, -scale.shape[1] % 4))
        out = F.scaled_mm(xq, layer.weight.t(), xs, F.ScalingType.BlockWise1x128, scale.t(),
                          F.ScalingType.BlockWise128x128, output_dtype=torch.bfloat16)[:rows]
        if bias is not None:
            out += bias
        return out if out.dtype == x.dtype else out.to(x.dtype)


def _row_pieces(layer: Linear) -> tuple[int, ...]:
    return tuple(layer.output_sizes) if isinstance(layer, MergedLinear) else (layer.out_features,)


def _copy(param: torch.Tensor, start: int, size: int, value: torch.Tensor) -> None:
    target = param.data.narrow(0, start, size)
    if target.shape != value.shape:
        raise ValueError(f"expected {tuple(target.shape)}, got {tuple(value.shape)}")
    target.copy_(value)


def _quantize_tokens(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token dynamic quantization: one Triton kernel on CUDA, torch elsewhere."""
    if x.is_cuda:
        ops = fused_ops()
        if ops is not None:
            return ops.quantize_fp8_rows(x)
    return quantize_rows(x)


def _padding_slots(rows: int) -> Optional[torch.Tensor]:
    """The step's KV slot mapping when it covers these rows: a CUDA-graph replay marks its padding
    rows with slot -1, and they must not set the real rows' activation scale."""
    meta = current_attention_metadata()
    if meta is None or meta.slot_mapping.shape[0] != rows:
        return None
    return meta.slot_mapping


def _quantize_tensor(x: torch.Tensor, slots: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor dynamic quantization: two Triton kernels on CUDA, torch elsewhere."""
    if x.is_cuda:
        ops = fused_ops()
        if ops is not None:
            return ops.quantize_fp8_tensor(x, slots)
    return quantize_tensor(x, slots=slots)


def finish_quantized(model: nn.Module) -> None:
    """Call each FP8 layer's :meth:`Fp8Linear.finish` once its weights are all loaded."""
    for module in model.modules():
        if isinstance(module, Linear) and module.quant is not None:
            module.quant.finish(module)


def _quantize_groups(x: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per (token, ``group`` columns) quantization for block-wise weights: (x_fp8 [M, K], scales
    [M, K / group]) with the scales column-major, as the block-scaled GEMM takes them."""
    m, k = x.shape
    xq, scale = quantize_rows(x.reshape(m * (k // group), group))
    return xq.reshape(m, k), scale.reshape(m, k // group).t().contiguous().t()



def quantization_method(model: nn.Module) -> Optional[str]:
    """vLLM's name of ``model``'s weight format: "fp8" (online or HF's), "compressed-tensors", or None."""
    for module in model.modules():
        if isinstance(module, Linear) and module.quant is not None:
            return "compressed-tensors" if module.quant.config.source == "compressed-tensors" else "fp8"
    return None
