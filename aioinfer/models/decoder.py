"""One pre-norm decoder-only transformer (Llama / Qwen2 / Qwen3 differ only in ArchConfig flags).

Module and parameter names follow HF (``model.layers.N.self_attn.o_proj.weight``...) except the
fused ``qkv_proj`` and ``gate_up_proj``, which ``load_weights`` fills from HF's separate tensors.
Everything runs on a flat batch: ``forward(input_ids [T], positions [T]) -> hidden [T, H]``.

With a tensor-parallel group (``tp``) each rank builds the same module tree with its share of the
heads, MLP width and vocabulary (layers/linear.py, layers/embedding.py); ``load_weights`` still
receives whole checkpoint tensors and the layers' loaders cut out this rank's part.
"""

from __future__ import annotations

from typing import Iterable, Optional

import torch
from torch import nn

from aioinfer.attention.backend import AttentionBackend
from aioinfer.attention.registry import get_attention_backend
from aioinfer.distributed.group import SINGLE, TPGroup
from aioinfer.layers.activation import get_act_and_mul
from aioinfer.layers.attention import Attention
from aioinfer.layers.embedding import LMHead, VocabEmbedding
from aioinfer.layers.kv_scales import kv_scale_target, scale_value
from aioinfer.layers.linear import MergedLinear, QKVLinear, RowParallelLinear, default_weight_loader
from aioinfer.layers.norm import RMSNorm
from aioinfer.layers.rotary import RotaryEmbedding, apply_rotary_qk
from aioinfer.models.arch_config import ArchConfig

# (fused param, HF name piece, shard id) — how separate checkpoint tensors map into fused params.
_STACKED = (
    ("qkv_proj", "q_proj", "q"),
    ("qkv_proj", "k_proj", "k"),
    ("qkv_proj", "v_proj", "v"),
    ("gate_up_proj", "gate_proj", 0),
    ("gate_up_proj", "up_proj", 1),
)


def unfuse(cfg: ArchConfig, name: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """A whole (unsharded) fused tensor as the HF-named pieces ``load_weights`` takes (views)."""
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    if ".qkv_proj." in name:
        pieces = zip(("q_proj", "k_proj", "v_proj"), tensor.split([q, kv, kv]))
        return [(name.replace(".qkv_proj.", f".{piece}."), t) for piece, t in pieces]
    if ".gate_up_proj." in name:
        pieces = zip(("gate_proj", "up_proj"), tensor.chunk(2))
        return [(name.replace(".gate_up_proj.", f".{piece}."), t) for piece, t in pieces]
    return [(name, tensor)]


class DecoderAttention(nn.Module):
    def __init__(self, cfg: ArchConfig, backend: AttentionBackend, tp: TPGroup = SINGLE) -> None:
        super().__init__()
        self.qkv_proj = QKVLinear(cfg.hidden_size, cfg.head_dim, cfg.num_heads, cfg.num_kv_heads, cfg.qkv_bias, tp)
        # This rank's heads (all of them at world size 1).
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.head_dim = cfg.head_dim
        self.q_size, self.kv_size = self.qkv_proj.q_size, self.qkv_proj.kv_size
        self.o_proj = RowParallelLinear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias=cfg.o_bias, tp=tp,
                                        name="num_attention_heads * head_dim")
        self.q_norm: Optional[RMSNorm] = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm: Optional[RMSNorm] = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.attn = Attention(self.num_heads, self.num_kv_heads, cfg.head_dim, cfg.head_dim**-0.5, backend)

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, reduce: bool = True) -> torch.Tensor:
        # hidden [T, H] -> [T, H] (reduce=False: this rank's partial sum of o_proj)
        num_tokens = hidden.shape[0]
        qkv = self.qkv_proj(hidden)  # [T, q_size + 2*kv_size]
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.reshape(num_tokens, self.num_heads, self.head_dim)
        k = k.reshape(num_tokens, self.num_kv_heads, self.head_dim)
        v = v.reshape(num_tokens, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)  # type: ignore[misc]
        q, k = apply_rotary_qk(q, k, cos, sin)  # one in-place Triton kernel on CUDA
        return self.o_proj(self.attn(q, k, v), reduce=reduce)


class DecoderMLP(nn.Module):
    def __init__(self, cfg: ArchConfig, tp: TPGroup = SINGLE) -> None:
        super().__init__()
        self.gate_up_proj = MergedLinear(cfg.hidden_size, [cfg.intermediate_size] * 2, bias=cfg.mlp_bias, tp=tp,
                                         names=["intermediate_size"] * 2)
        self.down_proj = RowParallelLinear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias, tp=tp,
                                           name="intermediate_size")
        self.act_fn = get_act_and_mul(cfg.hidden_act)

    def forward(self, x: torch.Tensor, reduce: bool = True) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)), reduce=reduce)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ArchConfig, backend: AttentionBackend, tp: TPGroup = SINGLE) -> None:
        super().__init__()
        self.self_attn = DecoderAttention(cfg, backend, tp)
        self.mlp = DecoderMLP(cfg, tp)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(
        self, hidden: torch.Tensor, residual: Optional[torch.Tensor], cos: torch.Tensor, sin: torch.Tensor,
        reduce_group=None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # The residual stream is carried separately so each norm fuses the previous block's add.
        # With ``reduce_group`` the row-parallel layers return partial sums and each norm sums them
        # over the ranks in its own kernel (tensor-parallel decode; the first layer's input, the
        # embedding, is whole already).
        if residual is None:
            residual = hidden
            hidden = self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual, reduce_group)
        hidden = self.self_attn(hidden, cos, sin, reduce=reduce_group is None)
        hidden, residual = self.post_attention_layernorm(hidden, residual, reduce_group)
        return self.mlp(hidden, reduce=reduce_group is None), residual


class DecoderModel(nn.Module):
    def __init__(self, cfg: ArchConfig, backend: AttentionBackend, tp: TPGroup = SINGLE) -> None:
        super().__init__()
        self.tp = tp
        self.embed_tokens = VocabEmbedding(cfg.vocab_size, cfg.hidden_size, tp)
        self.layers = nn.ModuleList(DecoderLayer(cfg, backend, tp) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(cfg.head_dim, cfg.rope, cfg.max_position_embeddings)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)  # [T, H]
        cos, sin = self.rotary_emb(positions, hidden.dtype)  # [T, rotary_dim] each, shared by all layers
        residual: Optional[torch.Tensor] = None
        # Decided once per forward from the token count, the same on every rank (and per CUDA graph).
        reduce_group = self.tp if self.tp.is_parallel and self.tp.fuses_norm(hidden) else None
        for layer in self.layers:
            hidden, residual = layer(hidden, residual, cos, sin, reduce_group)
        hidden, _ = self.norm(hidden, residual, reduce_group)
        return hidden


class DecoderForCausalLM(nn.Module):
    """Causal LM over a flat batch; subclasses only pin the architecture name."""

    def __init__(self, cfg: ArchConfig, attention_backend: Optional[AttentionBackend] = None,
                 tp: Optional[TPGroup] = None) -> None:
        super().__init__()
        self.config = cfg
        self.tp = tp or SINGLE
        backend = attention_backend if attention_backend is not None else get_attention_backend("torch")
        self.model = DecoderModel(cfg, backend, self.tp)
        self.lm_head = LMHead(cfg.vocab_size, cfg.hidden_size, self.tp)
        self.tie_weights()

    # Shape facts the runner needs to size the KV cache.
    @property
    def num_layers(self) -> int:
        return self.config.num_layers

    @property
    def num_kv_heads(self) -> int:
        """KV heads on this rank: its KV cache holds only these."""
        return self.model.layers[0].self_attn.num_kv_heads

    @property
    def head_dim(self) -> int:
        return self.config.head_dim

    def tie_weights(self) -> None:
        """Share the embedding with the LM head; call again after anything that re-creates params
        (``to_empty`` breaks sharing)."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def reset_buffers(self) -> None:
        """Recompute non-persistent buffers (rotary inv_freq) on the parameters' device."""
        self.model.rotary_emb.reset_buffers(self.model.embed_tokens.weight.device)

    def attention_layers(self) -> list[Attention]:
        return [layer.self_attn.attn for layer in self.model.layers]

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """input_ids, positions: [T] int64 over all scheduled tokens -> final-normed hidden [T, H]."""
        return self.model(input_ids, positions)

    def compute_logits(self, hidden: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """hidden [N, H] -> float32 logits [N, vocab] (into ``out`` when given)."""
        return self.lm_head(hidden, out)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy HF-named tensors into (fused) parameters, casting to each parameter's dtype/device.

        Returns the names of the parameters that were written. Rotary ``inv_freq`` buffers and, for
        tied models, ``lm_head.weight`` are skipped. Calibrated KV-cache scales (layers/kv_scales.py)
        set their layer's ``k_scale`` / ``v_scale``, which only an fp8 KV cache uses.
        """
        params = dict(self.named_parameters(remove_duplicate=False))
        modules = dict(self.named_modules())

        def loader_of(param_name: str):
            owner = modules[param_name.rpartition(".")[0]]
            return getattr(owner, "weight_loader", None)

        loaded: set[str] = set()
        for name, tensor in weights:
            if "rotary_emb.inv_freq" in name or "rotary_emb.cos_cached" in name or "rotary_emb.sin_cached" in name:
                continue
            if name == "lm_head.weight" and self.config.tie_word_embeddings:
                continue  # some tied checkpoints still store it; the embedding is authoritative
            kv_scale = kv_scale_target(name)
            if kv_scale is not None:  # before _STACKED: "k_proj.output_scale" is no qkv_proj parameter
                self._set_kv_scale(name, tensor, *kv_scale)
                continue
            for fused, piece, shard in _STACKED:
                if f".{piece}." in name:
                    target = name.replace(f".{piece}.", f".{fused}.")
                    param = params.get(target)
                    if param is None:
                        raise KeyError(f"checkpoint tensor {name!r} has no parameter {target!r} in this model")
                    loader_of(target)(param, tensor, shard)
                    loaded.add(target)
                    break
            else:
                param = params.get(name)
                if param is None:
                    raise KeyError(f"checkpoint tensor {name!r} has no matching parameter in this model")
                (loader_of(name) or default_weight_loader)(param, tensor)
                loaded.add(name)
        return loaded

    def _set_kv_scale(self, name: str, tensor: torch.Tensor, layer: int, which: str) -> None:
        """A checkpoint's KV-cache scale into layer ``layer``'s attention ("" : a query scale, dropped)."""
        if not 0 <= layer < len(self.model.layers):
            raise KeyError(f"checkpoint tensor {name!r} names layer {layer}; this model has {len(self.model.layers)}")
        if not which:
            return
        attn = self.model.layers[layer].self_attn.attn
        value = scale_value(name, tensor)
        if "k" in which:
            attn.k_scale = value
        if "v" in which:
            attn.v_scale = value
