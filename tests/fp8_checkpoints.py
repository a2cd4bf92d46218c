"""FP8 checkpoints on disk for CPU tests, in the layouts people ship, and their dequantized twins.

``write_fp8_checkpoint(src, dst, fmt)`` takes a tiny float32 HF folder (tiny_models.py) and writes
``dst`` with every decoder projection (q/k/v/o, gate/up/down) stored as float8_e4m3fn plus its
scales, the safetensors names and the ``quantization_config`` block of the format:

- ``ct-channel``: compressed-tensors FP8_DYNAMIC (llm-compressor): per-channel ``weight_scale``
  [N, 1] in bfloat16, activations dynamic per token;
- ``ct-tensor-static``: compressed-tensors W8A8 static: per-tensor ``weight_scale`` [1] and
  ``input_scale`` [1] (different for q, k and v, as calibration gives);
- ``ct-block``: compressed-tensors block strategy (``block_structure``), ``weight_scale`` per block;
- ``hf-block``: HF's ``quant_method: "fp8"`` with ``weight_block_size`` and ``weight_scale_inv``;
- ``hf-tensor-static``: HF's ``quant_method: "fp8"`` without blocks, ``activation_scheme: static``.

``write_dequantized(dst, ref)`` writes the same model with the stored FP8 weights dequantized to
float32 and no quantization block: the reference the FP8 paths are held to.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from aioinfer.layers.quantization.fp8 import FP8, FP8_MAX, dequantize_blocks, quantize_blocks, quantize_rows

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
FORMATS = ("ct-channel", "ct-tensor-static", "ct-block", "hf-block", "hf-tensor-static")
BLOCK = (16, 16)  # the tiny models' sizes are multiples of 16; real checkpoints use 128 x 128
INPUT_SCALES = {"q_proj": 0.020, "k_proj": 0.025, "v_proj": 0.030, "o_proj": 0.02, "gate_proj": 0.02,
                "up_proj": 0.022, "down_proj": 0.02}


def _ct_args(strategy: str, dynamic: bool, block=None) -> dict:
    return {"num_bits": 8, "type": "float", "symmetric": True, "strategy": strategy, "dynamic": dynamic,
            "group_size": None, "block_structure": block, "observer": "minmax", "actorder": None}


def quantization_block(fmt: str) -> dict:
    if fmt.startswith("ct-"):
        weights = {"ct-channel": _ct_args("channel", False), "ct-tensor-static": _ct_args("tensor", False),
                   "ct-block": _ct_args("block", False, list(BLOCK))}[fmt]
        acts = _ct_args("tensor", False) if fmt == "ct-tensor-static" else _ct_args("token", True)
        if fmt == "ct-block":
            acts = _ct_args("group", True)
        return {"quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
                "ignore": ["lm_head"], "kv_cache_scheme": None,
                "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": acts,
                                              "output_activations": None}}}
    if fmt == "hf-block":
        return {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                "weight_block_size": list(BLOCK), "modules_to_not_convert": ["lm_head"]}
    if fmt == "hf-tensor-static":
        return {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "static"}
    raise ValueError(fmt)


def _tensors(src: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for path in sorted(src.glob("*.safetensors")):
        out.update(load_file(str(path)))
    return out


def write_fp8_checkpoint(src: Path, dst: Path, fmt: str) -> Path:
    """``src``'s model with its projections in FP8 as ``fmt`` stores them (see the module docstring)."""
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.safetensors", "*.safetensors.index.json"))
    tensors = _tensors(src)
    out: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        piece = name.split(".")[-2] if name.endswith(".weight") else None
        if piece not in PROJECTIONS:
            out[name] = tensor
            continue
        base = name[: -len(".weight")]
        if fmt in ("ct-block", "hf-block"):
            q, scale = quantize_blocks(tensor, BLOCK)
            out[name] = q
            out[base + (".weight_scale" if fmt == "ct-block" else ".weight_scale_inv")] = scale
        elif fmt == "ct-channel":
            q, scale = quantize_rows(tensor)
            out[name] = q
            out[base + ".weight_scale"] = scale.to(torch.bfloat16)  # [N, 1], as llm-compressor saves it
        else:  # one scale for the whole tensor, plus a static input scale
            scale = (tensor.abs().amax() / FP8_MAX).reshape(1)
            out[name] = (tensor / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)
            out[base + ".weight_scale"] = scale if fmt == "ct-tensor-static" else scale.reshape(())
            input_scale = torch.tensor([INPUT_SCALES[piece]], dtype=torch.float32)
            out[base + ".input_scale"] = input_scale if fmt == "ct-tensor-static" else input_scale.reshape(())
    save_file({k: v.contiguous() for k, v in out.items()}, str(dst / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = quantization_block(fmt)
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    return dst


def dequantized_weights(fp8_folder: Path) -> dict[str, torch.Tensor]:
    """The float32 weights an FP8 checkpoint stands for (its quantization block says how)."""
    tensors = _tensors(fp8_folder)
    block = json.loads((fp8_folder / "config.json").read_text())["quantization_config"]
    is_block = block.get("weight_block_size") or any(
        g["weights"].get("strategy") == "block" for g in block.get("config_groups", {}).values())
    out: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        if name.endswith((".weight_scale", ".weight_scale_inv", ".input_scale")):
            continue
        if tensor.dtype != FP8:
            out[name] = tensor
            continue
        base = name[: -len(".weight")]
        scale = tensors.get(base + ".weight_scale", tensors.get(base + ".weight_scale_inv")).float()
        if is_block:
            out[name] = dequantize_blocks(tensor, scale, BLOCK)
        else:
            out[name] = tensor.float() * (scale.reshape(-1, 1) if scale.numel() > 1 else scale.reshape(()))
    return out


def input_scales(fp8_folder: Path) -> dict[str, float]:
    """HF module name of each projection -> its static input scale (static formats only)."""
    return {name[: -len(".input_scale")]: float(t.reshape(())) for name, t in _tensors(fp8_folder).items()
            if name.endswith(".input_scale")}


def write_dequantized(fp8_folder: Path, dst: Path) -> Path:
    """A plain float32 HF folder holding ``fp8_folder``'s dequantized weights."""
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(fp8_folder, dst, ignore=shutil.ignore_patterns("*.safetensors"))
    save_file(dequantized_weights(fp8_folder), str(dst / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((dst / "config.json").read_text())
    del config["quantization_config"]
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    return dst
