"""The architecture facts a model definition needs, read once from config.json or GGUF metadata.

Both transformers-4 style (``rope_theta`` + ``rope_scaling``) and transformers-5 style
(``rope_parameters: {rope_theta, rope_type, ...}``) configs land in the same typed record, so model
code never looks at raw dicts.

Sliding-window attention is read here too, with transformers' semantics per model type, so that a
checkpoint whose layers only look back a window is refused rather than run with full attention
(``check_attention_window``): the kernels and the KV manager do not implement the window yet.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from aioinfer.layers.rope_config import RopeConfig

# model_type -> the architecture class name we register it under, for configs without "architectures".
_MODEL_TYPE_TO_ARCH = {
    "qwen2": "Qwen2ForCausalLM",
    "llama": "LlamaForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "mistral": "MistralForCausalLM",
}

@dataclass(frozen=True, slots=True)
class ArchConfig:
    """Shape and numerics of a decoder-only model; enough to build it without transformers."""

    architecture: str  # registry key, e.g. "Qwen2ForCausalLM"
    model_type: str  # "qwen2" | "llama" | "qwen3" | ...
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int  # query heads
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int  # tokens
    rope: RopeConfig = field(default_factory=RopeConfig)
    tie_word_embeddings: bool = False
    qkv_bias: bool = False  # bias on q/k/v projections (Qwen2 always)
    o_bias: bool = False  # bias on o_proj (Llama attention_bias=True)
    mlp_bias: bool = False
    qk_norm: bool = False  # per-head RMSNorm on q and k before RoPE (Qwen3)
    hidden_act: str = "silu"
    bos_token_id: Optional[int] = None
    eos_token_ids: tuple[int, ...] = ()
    dtype: Optional[str] = None  # checkpoint dtype name ("bfloat16"), None when unknown
    # Tokens a query sees (itself included) in the layers that slide; None when no layer does.
    sliding_window: Optional[int] = None
    sliding_window_layers: tuple[int, ...] = ()  # layer indices that slide (empty when none)

    @property
    def rope_theta(self) -> float:
        return self.rope.theta

    @staticmethod
    def from_hf_dict(d: dict[str, Any]) -> "ArchConfig":
        """Build from a parsed config.json (either transformers generation of rope keys)."""
        model_type = d.get("model_type", "")
        archs = d.get("architectures") or []
        architecture = archs[0] if archs else _MODEL_TYPE_TO_ARCH.get(model_type, "")
        if not architecture:
            raise ValueError("config.json names neither 'architectures' nor a known 'model_type'")
        if not model_type:
            model_type = {v: k for k, v in _MODEL_TYPE_TO_ARCH.items()}.get(architecture, "")
        hidden = int(d["hidden_size"])
        num_heads = int(d["num_attention_heads"])
        num_kv_heads = int(d.get("num_key_value_heads") or num_heads)
        head_dim = int(d.get("head_dim") or hidden // num_heads)
        max_pos = int(d.get("max_position_embeddings", 2048))

        # transformers 5 keeps everything under rope_parameters; 4.x split it into rope_theta + rope_scaling.
        rope_params = dict(d.get("rope_parameters") or {})
        if not rope_params:
            rope_params = dict(d.get("rope_scaling") or {})
        theta = float(rope_params.get("rope_theta", d.get("rope_theta", 10000.0)))
        if "partial_rotary_factor" in d and "partial_rotary_factor" not in rope_params:
            rope_params["partial_rotary_factor"] = d["partial_rotary_factor"]
        if "original_max_position_embeddings" in d:
            rope_params.setdefault("original_max_position_embeddings", d["original_max_position_embeddings"])
        rope = RopeConfig.from_dict(rope_params, theta, max_pos)

        is_qwen2 = model_type == "qwen2" or architecture.startswith("Qwen2")
        attention_bias = bool(d.get("attention_bias", False))
        eos = d.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else (() if eos is None else (int(eos),))
        dtype = d.get("dtype", d.get("torch_dtype"))
        num_layers = int(d["num_hidden_layers"])
        window, window_layers = _sliding_window(d, model_type, num_layers)
        return ArchConfig(
            architecture=architecture,
            model_type=model_type,
            vocab_size=int(d["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(d["intermediate_size"]),
            num_layers=num_layers,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=max_pos,
            rope=rope,
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            # Qwen2 hard-codes q/k/v bias (and none on o_proj) whatever the config says.
            qkv_bias=True if is_qwen2 else attention_bias,
            o_bias=False if is_qwen2 else attention_bias,
            mlp_bias=bool(d.get("mlp_bias", False)),
            qk_norm=model_type == "qwen3" or architecture.startswith("Qwen3"),
            hidden_act=d.get("hidden_act", "silu"),
            bos_token_id=d.get("bos_token_id"),
            eos_token_ids=eos_ids,
            dtype=str(dtype) if dtype is not None else None,
            sliding_window=window,
            sliding_window_layers=window_layers,
        )


def _sliding_window(d: dict[str, Any], model_type: str, num_layers: int) -> tuple[Optional[int], tuple[int, ...]]:
    """(window, sliding layers) as transformers reads them from config.json, for its config class of
    ``model_type``; (None, ()) when every layer attends in full.

    - mistral: ``sliding_window`` on every layer; a config.json without the key gets MistralConfig's
      default, 4096 (Mistral-7B-v0.1 sets 4096; v0.2 and later set null).
    - qwen2 / qwen3: only with ``use_sliding_window: true`` (false in every released Qwen2.5 and Qwen3
      config, which still carry a ``sliding_window`` value), then ``sliding_window`` (default 4096) on
      the layers that ``layer_types`` marks ``sliding_attention`` or, without it, on layers
      ``i >= max_window_layers`` (default 28: none of a 28-layer model).
    - anything else (llama): LlamaConfig has no window, so a stray key is ignored, as there.
    """
    if model_type == "mistral":
        window = d.get("sliding_window", 4096)
        layers = tuple(range(num_layers))
    elif model_type in ("qwen2", "qwen3"):
        if not d.get("use_sliding_window", False):
            return None, ()
        window = d.get("sliding_window", 4096)
        types = d.get("layer_types")
        if types:
            layers = tuple(i for i, t in enumerate(types) if t == "sliding_attention")
        else:
            first = int(d.get("max_window_layers", 28))
            layers = tuple(range(first, num_layers))
    else:
        return None, ()
    if window is None or not layers:
        return None, ()
    return int(window), layers


def check_attention_window(cfg: ArchConfig, max_model_len: int) -> None:
    """Refuse a model whose sliding window would bind within ``max_model_len`` tokens.

    A query at position p attends to keys p - window + 1 .. p (transformers' sliding mask), so while
    a sequence is at most ``window`` tokens long the window hides nothing and full attention is
    exact; past that, full attention would silently compute something the model was not trained on.
    """
    window = cfg.sliding_window
    if window is None or max_model_len <= window:
        return
    layers = cfg.sliding_window_layers
    which = ("every layer" if len(layers) == cfg.num_layers
             else f"layers {layers[0]}..{layers[-1]}" if layers == tuple(range(layers[0], layers[-1] + 1))
             else f"layers {', '.join(map(str, layers))}")
    raise ValueError(
        f"{cfg.architecture} uses sliding-window attention ({which} of {cfg.num_layers} attend to the last "
        f"{window} tokens only), which aioinfer does not implement: a context of {max_model_len} tokens would "
        f"run full attention past the window and give wrong outputs; set max_model_len to {window} or less "
        f"(--max-model-len {window}), where the window hides nothing")
