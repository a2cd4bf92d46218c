"""RoPE's parameters as a model config states them (HF ``rope_type`` names), read once into a typed
record: the rotary layer computes its frequencies from it, and the model configs (config.json,
GGUF metadata) fill it. Here, beside the layer that uses it, so that the layer needs nothing from
the models above it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


@dataclass(frozen=True, slots=True)
class RopeConfig:
    """RoPE frequencies: base theta plus the optional scaling recipe (HF ``rope_type`` names)."""

    rope_type: str = "default"  # default | linear | llama3 | yarn
    theta: float = 10000.0
    factor: float = 1.0  # linear/llama3/yarn context extension factor
    partial_rotary_factor: float = 1.0  # fraction of head_dim that rotates
    original_max_position_embeddings: Optional[int] = None  # tokens; llama3 / yarn
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0  # yarn
    attention_factor: Optional[float] = None  # yarn: cos/sin multiplier; None -> derived from factor
    mscale: Optional[float] = None  # yarn
    mscale_all_dim: Optional[float] = None  # yarn
    truncate: bool = True  # yarn: round the correction range to whole dims

    @staticmethod
    def from_dict(params: dict[str, Any], theta: float, max_position_embeddings: int) -> "RopeConfig":
        rope_type = params.get("rope_type", params.get("type", "default")) or "default"
        if rope_type not in _ROPE_TYPES:
            raise ValueError(f"unsupported rope_type {rope_type!r}; supported: {', '.join(_ROPE_TYPES)}")
        orig = params.get("original_max_position_embeddings")
        if orig is None and rope_type in ("llama3", "yarn"):
            # transformers' standardize_rope_params does the same fallback.
            orig = max_position_embeddings
        return RopeConfig(
            rope_type=rope_type,
            theta=float(params.get("rope_theta", theta)),
            factor=float(params.get("factor", 1.0) or 1.0),
            partial_rotary_factor=float(params.get("partial_rotary_factor", 1.0) or 1.0),
            original_max_position_embeddings=int(orig) if orig is not None else None,
            low_freq_factor=float(params.get("low_freq_factor", 1.0)),
            high_freq_factor=float(params.get("high_freq_factor", 4.0)),
            beta_fast=float(params.get("beta_fast") or 32.0),
            beta_slow=float(params.get("beta_slow") or 1.0),
            attention_factor=params.get("attention_factor"),
            mscale=params.get("mscale"),
            mscale_all_dim=params.get("mscale_all_dim"),
            truncate=bool(params.get("truncate", True)),
        )
