"""Streaming checkpoint readers and dummy initialisation.

Tensors are yielded one at a time so the loader copies each straight into its parameter: peak
extra memory is one tensor, never a second copy of the model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import torch
from torch import nn


def safetensors_files(folder: Path) -> list[Path]:
    """The checkpoint's shard files: those named by ``model.safetensors.index.json``, else ``*.safetensors``."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = sorted({folder / name for name in weight_map.values()})
    else:
        files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {folder}")
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise FileNotFoundError(f"checkpoint shards listed in the index are missing: {missing}")
    return files


def iterate_safetensors(folder: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (HF name, CPU tensor) for every tensor of every shard, one tensor at a time (mmap-backed)."""
    from safetensors import safe_open

    for path in safetensors_files(folder):
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


@torch.no_grad()
def init_dummy_weights(model: nn.Module, seed: int, std: float = 0.02) -> None:
    """Deterministic random weights for benchmarks: N(0, std) matrices, unit norms, zero biases.

    ``std`` 0.02 (HF's usual initializer_range) keeps activations and logits finite in bf16.
    Values are drawn for the *whole* (unsharded) parameters, in order, and then go through the
    checkpoint loaders like real weights, so every tensor-parallel size gets the same model.
    """
    from aioinfer.models.decoder import unfuse

    cfg = model.config
    with torch.device("meta"):
        whole = type(model)(cfg)  # shapes only: the unsharded model costs no memory on meta
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)

    def tensors() -> Iterator[tuple[str, torch.Tensor]]:
        for name, param in whole.named_parameters():  # tied params appear once
            if name.endswith("norm.weight"):
                tensor = torch.ones(param.shape, device=device)
            elif name.endswith(".bias"):
                tensor = torch.zeros(param.shape, device=device)
            else:
                tensor = torch.empty(param.shape, dtype=torch.float32, device=device)
                tensor.normal_(0.0, std, generator=generator)
            yield from unfuse(cfg, name, tensor)

    model.load_weights(tensors())
