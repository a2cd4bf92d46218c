"""Which linear layers hold FP8 weights, in what layout, and how their activations are scaled.

Read from the checkpoint's ``config.json`` ``quantization_config`` (the formats people ship) or
asked for with the engine option ``quantization="fp8"`` (vLLM's name: quantize a bf16/fp16/fp32
checkpoint, or a GGUF, to FP8 while it loads). Three on-disk formats are understood:

- compressed-tensors (llm-compressor's ``FP8_DYNAMIC``, ``FP8`` / W8A8 static): ``quant_method:
  "compressed-tensors"``, ``format: "float-quantized"`` (or ``naive-quantized``), one config group whose
  weights are 8-bit floats with a ``channel`` or ``tensor`` strategy (or ``block`` with its
  ``block_structure``) and whose input activations are 8-bit floats, ``dynamic`` per token or static
  per tensor (``input_scale``); tensors ``*.weight`` (e4m3), ``*.weight_scale``, ``*.input_scale``;
- HF's FP8 (``quant_method: "fp8"``): with ``weight_block_size: [128, 128]`` (Qwen3's and
  DeepSeek's ``-FP8`` models: ``*.weight_scale_inv`` per block, activations per token-block at run
  time), or without it (``*.weight_scale`` per tensor, ``activation_scheme`` dynamic or static);
- online (vLLM's ``quantization="fp8"``): one scale per weight tensor and one per activation tensor,
  computed at run time, as vLLM's online FP8 keeps them. Per-tensor scales are what cuBLASLt's fastest
  FP8 GEMM takes (23-44 % less time than the row-wise-scaled one at 7b's decode shapes on an H100,
  docs/performance.md); the weights are quantized per output row as they load and brought to their
  layer's largest scale once every piece of a fused layer is in (:meth:`Fp8Linear.finish`).

Anything else (4-bit, int8, a KV-cache-only scheme) is refused here with the reason, before any
weight is read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Optional

# The engine option's accepted values. "fp8" quantizes an unquantized checkpoint; with a checkpoint
# that is FP8 already, "fp8" and the checkpoint's own method name both mean "as stored".
QUANTIZATION_METHODS = ("fp8", "compressed-tensors")


class QuantizationError(ValueError):
    """A quantization config or option aioinfer cannot serve (the message says why)."""


@dataclass(frozen=True, slots=True)
class QuantConfig:
    """FP8 weights of every decoder linear layer not in ``ignore``.

    weights: "channel" (a scale per output row; per-tensor checkpoints are stored this way too),
    "tensor" (one scale per layer: the online format, whose activations then get one scale per tensor
    at run time) or "block" (a scale per ``block`` of rows x columns). activations: "dynamic" (per
    token at run time; per tensor with "tensor" weights; per 1 x block[1] group for block weights) or
    "static" (the checkpoint's per-tensor ``input_scale``).
    source: "online", "compressed-tensors" or "fp8" (HF). ``checkpoint_scales``: whether scales are
    tensors of the checkpoint (False: computed as the weights load).
    """

    source: str
    weights: str = "channel"
    activations: str = "dynamic"
    block: Optional[tuple[int, int]] = None
    ignore: tuple[str, ...] = field(default=())

    @property
    def checkpoint_scales(self) -> bool:
        return self.source != "online"

    def quantizes(self, module_name: str) -> bool:
        """Whether the linear layer ``module_name`` (ours: ``model.layers.0.self_attn.qkv_proj``) is FP8.

        ``ignore`` holds HF names or ``re:`` patterns (compressed-tensors); a fused layer is ignored
        when any of its checkpoint pieces is (they are quantized, or not, together)."""
        pieces = [module_name]
        for fused, parts in (("qkv_proj", ("q_proj", "k_proj", "v_proj")), ("gate_up_proj", ("gate_proj", "up_proj"))):
            if module_name.endswith("." + fused):
                pieces += [module_name[: -len(fused)] + p for p in parts]
        for pattern in self.ignore:
            for name in pieces:
                if pattern.startswith("re:"):
                    if re.match(pattern[3:], name):
                        return False
                elif name == pattern or name.endswith("." + pattern) or pattern.endswith("." + name):
                    return False
        return True


def quant_config(hf_config: dict[str, Any], option: Optional[str]) -> Optional[QuantConfig]:
    """The QuantConfig of a checkpoint (its config.json as a dict) under the engine's ``quantization``
    option (None: whatever the checkpoint says). None: plain weights."""
    if option is not None and option not in QUANTIZATION_METHODS:
        raise QuantizationError(f"quantization {option!r} is not supported (supported: "
                                f"{', '.join(QUANTIZATION_METHODS)})")
    raw = hf_config.get("quantization_config") or hf_config.get("compression_config")
    if raw is None:
        if option == "compressed-tensors":
            raise QuantizationError("quantization 'compressed-tensors' asks for a compressed-tensors checkpoint, "
                                    "but config.json has no quantization_config")
        return QuantConfig(source="online", weights="tensor") if option == "fp8" else None
    method = raw.get("quant_method")
    if method == "compressed-tensors":
        config = _compressed_tensors(raw)
    elif method == "fp8":
        config = _hf_fp8(raw)
    else:
        raise QuantizationError(f"checkpoint quantization {method!r} is not supported (FP8 checkpoints in the "
                                f"compressed-tensors or HF 'fp8' formats are)")
    if option is not None and option not in ("fp8", method):
        raise QuantizationError(f"quantization {option!r} does not match the checkpoint's {method!r}")
    return config


def _hf_fp8(raw: dict[str, Any]) -> QuantConfig:
    fmt = raw.get("fmt", "e4m3")
    if fmt != "e4m3":
        raise QuantizationError(f"FP8 format {fmt!r} is not supported (e4m3 is)")
    scheme = raw.get("activation_scheme", "dynamic")
    if scheme not in ("dynamic", "static"):
        raise QuantizationError(f"activation_scheme {scheme!r} is not supported (dynamic, static)")
    ignore = tuple(raw.get("ignored_layers") or raw.get("modules_to_not_convert") or ())
    block = raw.get("weight_block_size")
    if block is None:
        return QuantConfig(source="fp8", activations=scheme, ignore=ignore)
    if scheme != "dynamic":
        raise QuantizationError("block-wise FP8 weights need dynamic activations")
    return QuantConfig(source="fp8", weights="block", block=_block(block), ignore=ignore)


def _compressed_tensors(raw: dict[str, Any]) -> QuantConfig:
    fmt = raw.get("format")
    if fmt not in ("float-quantized", "naive-quantized"):
        raise QuantizationError(f"compressed-tensors format {fmt!r} is not supported (float-quantized FP8 is)")
    if raw.get("kv_cache_scheme") and not raw.get("config_groups"):
        raise QuantizationError("a compressed-tensors checkpoint with a KV-cache scheme alone is not supported")
    groups = list((raw.get("config_groups") or {}).values())
    if len(groups) != 1:
        raise QuantizationError(f"compressed-tensors: one config group is supported, got {len(groups)}")
    group = groups[0]
    targets = group.get("targets") or ["Linear"]
    if targets != ["Linear"]:
        raise QuantizationError(f"compressed-tensors: targets {targets} are not supported (['Linear'] is)")
    weights, acts = group.get("weights") or {}, group.get("input_activations")
    _float8(weights, "weights")
    if acts is None:
        raise QuantizationError("compressed-tensors: weight-only FP8 is not supported (FP8 activations are needed)")
    _float8(acts, "input_activations")
    strategy = weights.get("strategy")
    if weights.get("dynamic"):
        raise QuantizationError("compressed-tensors: dynamic weight scales are not supported")
    if strategy == "block":
        if not acts.get("dynamic"):
            raise QuantizationError("compressed-tensors: block-wise FP8 weights need dynamic activations")
        return QuantConfig(source="compressed-tensors", weights="block",
                           block=_block(weights.get("block_structure")), ignore=tuple(raw.get("ignore") or ()))
    if strategy not in ("channel", "tensor"):
        raise QuantizationError(f"compressed-tensors: weight strategy {strategy!r} is not supported "
                                f"(channel, tensor, block)")
    if acts.get("dynamic"):
        if acts.get("strategy") not in ("token", "tensor", None):
            raise QuantizationError(f"compressed-tensors: dynamic activation strategy {acts.get('strategy')!r} "
                                    f"is not supported (token)")
        activations = "dynamic"
    else:
        if acts.get("strategy") not in ("tensor", None):
            raise QuantizationError(f"compressed-tensors: static activation strategy {acts.get('strategy')!r} "
                                    f"is not supported (tensor)")
        activations = "static"
    return QuantConfig(source="compressed-tensors", activations=activations, ignore=tuple(raw.get("ignore") or ()))


def _float8(args: dict[str, Any], what: str) -> None:
    if args.get("num_bits") != 8 or args.get("type") != "float":
        raise QuantizationError(f"compressed-tensors: {what} of {args.get('num_bits')} bits, type "
                                f"{args.get('type')!r}, are not supported (8-bit float is)")
    if args.get("symmetric") is False:
        raise QuantizationError(f"compressed-tensors: asymmetric {what} are not supported")


def _block(value: Any) -> tuple[int, int]:
    if (not isinstance(value, (list, tuple)) or len(value) != 2
            or not all(isinstance(v, int) and v > 0 for v in value)):
        raise QuantizationError(f"weight block size must be two positive integers, got {value!r}")
    return int(value[0]), int(value[1])
