"""Calibrated KV-cache scales in checkpoints: which tensor names carry them, and the value each holds.

An fp8 KV cache stores ``k / k_scale`` (and ``v / v_scale``) per layer; a checkpoint quantized for it
ships the scales its calibration found, under one of several names depending on the tool that made
it. vLLM reads them all (its ``maybe_remap_kv_scale_name``); so does aioinfer, here in one place so
that ``load_weights`` stays a loop over parameters:

- ``model.layers.N.self_attn.k_scale`` / ``v_scale`` (vLLM's own, llm-compressor's older output),
  and ``...self_attn.attn.k_scale`` (vLLM's module path);
- ``...self_attn.k_proj.k_scale`` / ``v_proj.v_scale`` (NVIDIA ModelOpt);
- ``...self_attn.k_proj.output_scale`` / ``v_proj.output_scale`` (compressed-tensors' kv_cache_scheme);
- ``...self_attn.kv_scale`` (an older single scale for both).

Query and probability scales (``q_scale``, ``q_proj.output_scale``, ``prob_scale``) come with the same
checkpoints for fp8 attention math, which aioinfer does not do (attention runs in the query dtype):
they are recognised and dropped. With a KV cache that is not fp8 every scale is ignored (the
backends only apply them to an fp8 cache), so such a checkpoint loads either way.
"""

from __future__ import annotations

import logging
import re
from typing import Optional

import torch

logger = logging.getLogger(__name__)

# name -> (layer index, what): "k", "v", "kv" (both) or "" (a scale aioinfer has no use for)
_SCALE_NAME = re.compile(
    r"(?:.*\.)?layers\.(\d+)\.self_attn\."
    r"(?:(?:attn\.)?(k_scale|v_scale|kv_scale|q_scale|prob_scale)"
    r"|k_proj\.(k_scale|output_scale)|v_proj\.(v_scale|output_scale)|q_proj\.(q_scale|output_scale))$"
)


def kv_scale_target(name: str) -> Optional[tuple[int, str]]:
    """``(layer, "k" | "v" | "kv" | "")`` when checkpoint tensor ``name`` is a KV-cache (or query) scale,
    None for any other tensor. ``""``: a query or probability scale, to be skipped."""
    match = _SCALE_NAME.fullmatch(name)
    if match is None:
        return None
    layer = int(match.group(1))
    plain, k_proj, v_proj = match.group(2), match.group(3), match.group(4)
    if plain is not None:
        return layer, {"k_scale": "k", "v_scale": "v", "kv_scale": "kv"}.get(plain, "")
    if k_proj is not None:
        return layer, "k"
    if v_proj is not None:
        return layer, "v"
    return layer, ""  # q_proj's


def scale_value(name: str, tensor: torch.Tensor) -> float:
    """The per-tensor scale ``tensor`` holds, as a Python float (read once, at load).

    A scale with several elements (per head, or one per fused shard) is taken at its maximum: the
    cache then holds every value unclipped, at a little less precision for the other heads.
    ValueError for a scale that is not finite and positive: it would fill the cache with inf or NaN.
    """
    values = tensor.detach().to(torch.float32).reshape(-1)
    if values.numel() == 0:
        raise ValueError(f"checkpoint tensor {name!r} is an empty KV-cache scale")
    value = float(values.max())
    if values.numel() > 1:
        logger.info("%s: %d scales, the KV cache uses their maximum %g (one scale per layer)", name,
                    values.numel(), value)
    if not (value > 0 and value != float("inf")):
        raise ValueError(f"checkpoint tensor {name!r}: a KV-cache scale must be finite and > 0, got {value}")
    return value
