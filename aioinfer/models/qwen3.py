"""Qwen3ForCausalLM: the decoder with per-head RMSNorm on q and k before RoPE, no q/k/v bias."""

from aioinfer.models.decoder import DecoderForCausalLM


class Qwen3ForCausalLM(DecoderForCausalLM):
    pass
