"""LlamaForCausalLM (Llama 2/3, SmolLM2, Mistral without sliding window): the plain decoder."""

from aioinfer.models.decoder import DecoderForCausalLM


class LlamaForCausalLM(DecoderForCausalLM):
    pass
