"""Qwen2ForCausalLM (Qwen2 / Qwen2.5): the decoder with q/k/v bias (ArchConfig.qkv_bias is forced on).

Sliding-window attention (``use_sliding_window``) is off in every released Qwen2.5 config and is
not implemented.
"""

from aioinfer.models.decoder import DecoderForCausalLM


class Qwen2ForCausalLM(DecoderForCausalLM):
    pass
