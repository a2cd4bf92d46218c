"""Architecture name (config.json ``architectures[0]``) -> model class."""

from __future__ import annotations

from aioinfer.models.decoder import DecoderForCausalLM
from aioinfer.models.llama import LlamaForCausalLM
from aioinfer.models.qwen2 import Qwen2ForCausalLM
from aioinfer.models.qwen3 import Qwen3ForCausalLM

MODEL_REGISTRY: dict[str, type[DecoderForCausalLM]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": Qwen2ForCausalLM,
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
}


def get_model_class(architecture: str) -> type[DecoderForCausalLM]:
    try:
        return MODEL_REGISTRY[architecture]
    except KeyError:
        raise ValueError(
            f"unsupported architecture {architecture!r}; supported: {', '.join(sorted(MODEL_REGISTRY))}"
        ) from None
