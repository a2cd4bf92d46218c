"""Causal GQA softmax attention over a contiguous context, in plain torch.

The torch backend's per-sequence kernel (torch_backend.py), the interface's no-cache prefill
(backend.py) and the reference the Triton kernels are tested against (triton_ops/). Its own module
so that all of them import it without importing one another.
"""

from __future__ import annotations

import torch


def dense_causal_attention(
    query: torch.Tensor,  # [L, Hq, D]: the last L positions of the context
    key: torch.Tensor,  # [S, Hkv, D], S >= L
    value: torch.Tensor,  # [S, Hkv, D]
    scale: float,
) -> torch.Tensor:
    """Causal GQA attention over a contiguous context, float32 accumulation. Returns [L, Hq, D]."""
    q_len, num_heads, head_dim = query.shape
    seq_len, num_kv_heads, _ = key.shape
    group = num_heads // num_kv_heads
    # Query head h reads kv head h // group (HF repeat_kv order), so group the query heads per kv head.
    q = query.to(torch.float32).reshape(q_len, num_kv_heads, group, head_dim).permute(1, 2, 0, 3)  # [Hkv, G, L, D]
    k = key.to(torch.float32).permute(1, 0, 2)  # [Hkv, S, D]
    v = value.to(torch.float32).permute(1, 0, 2)  # [Hkv, S, D]
    scores = torch.matmul(q, k.unsqueeze(1).transpose(-1, -2)) * scale  # [Hkv, G, L, S]
    # Query j sits at absolute position seq_len - q_len + j and sees keys at positions <= that.
    q_pos = torch.arange(seq_len - q_len, seq_len, device=query.device)[:, None]
    k_pos = torch.arange(seq_len, device=query.device)[None, :]
    scores = scores.masked_fill(k_pos > q_pos, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = torch.matmul(probs, v.unsqueeze(1))  # [Hkv, G, L, D]
    return out.permute(2, 0, 1, 3).reshape(q_len, num_heads, head_dim).to(query.dtype)
