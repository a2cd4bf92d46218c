"""The model definitions (Qwen2, Qwen3, Llama and the decoder they share), their typed configs and
the loaders that fill them: HF safetensors, GGUF (dequantized), dummy weights, hub ids."""
