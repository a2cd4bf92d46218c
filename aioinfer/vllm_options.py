"""vLLM's ``LLM`` / engine keyword arguments that aioinfer spells differently, accepts without effect,
or refuses with the reason (docs/vllm_compatibility.md has the table).

``EngineConfig.from_kwargs`` runs ``translate`` first, so ``LLM``, ``Engine`` and
``DataParallelEngine`` take a vLLM script's options: a renamed one under aioinfer's name; one that
changes nothing here is dropped (one log line per option and process); one whose value would
change the result, but which aioinfer does not implement, is a ``ValueError`` naming it, never a
silent difference. Unknown options stay a ``TypeError`` (EngineConfig.from_kwargs).
"""

from __future__ import annotations

import logging
from typing import Any, Callable

logger = logging.getLogger(__name__)

# vLLM's name -> aioinfer's (same meaning and unit)
RENAMED = {"swap_space": "swap_space_gib"}

# Options with no effect here, whatever their value, and why.
NO_EFFECT = {
    "trust_remote_code": "no model code is downloaded or run",
    "disable_log_stats": "the offline engine logs no periodic stats",
    "disable_custom_all_reduce": "the tensor-parallel all-reduce is chosen by the engine (distributed/)",
    "disable_async_output_proc": "outputs are processed on the engine's thread between steps",
    "max_seq_len_to_capture": "CUDA graphs are captured per decode batch size (max_cuda_graph_batch_size)",
    "compilation_config": "aioinfer does not use torch.compile; CUDA graphs are its own",
    "hf_token": "no model hub is contacted for a local model",
    "download_dir": "models are local folders or .gguf files (or the default model's cache)",
    "scheduling_policy": "requests are served first come, first served; a request's priority, when set, "
                         "orders them (both of vLLM's policies)",
}


def _only(*allowed: Any) -> Callable[[Any], bool]:
    return lambda value: value in allowed


# Options accepted at the value that means what aioinfer does, refused otherwise: (check, reason).
ONLY_DEFAULT: dict[str, tuple[Callable[[Any], bool], str]] = {
    "quantization": (_only(None), "quantized inference is not implemented (a quantized GGUF file loads, "
                                  "dequantized to the model's dtype)"),
    "kv_cache_dtype": (_only("auto", None), "the KV cache is kept in the model's dtype"),
    "cpu_offload_gb": (_only(0, 0.0, None), "weights are not offloaded to the CPU"),
    "pipeline_parallel_size": (_only(1, None), "only tensor and data parallelism exist"),
    "enable_lora": (_only(False, None), "LoRA adapters are not supported"),
    "enable_chunked_prefill": (_only(True, None), "prefill is always chunked within the step's token budget"),
    "tokenizer_mode": (_only("auto", "hf", None), "the Hugging Face (fast) tokenizer is the only one"),
    "skip_tokenizer_init": (_only(False, None), "the tokenizer is always loaded when the model has one"),
    "revision": (_only(None, "main"), "models are loaded from local files; pick the revision when downloading"),
    "tokenizer_revision": (_only(None, "main"), "models are loaded from local files"),
    "distributed_executor_backend": (_only(None, "mp"), "tensor-parallel ranks are local processes (mp)"),
}

_logged: set[str] = set()


def translate(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` with vLLM's spellings made aioinfer's (a new dict); raises ValueError for an option
    aioinfer would not honour."""
    out = dict(kwargs)
    for vllm_name, name in RENAMED.items():
        if vllm_name in out:
            if name in out:
                raise ValueError(f"{vllm_name} and {name} are the same option: give one")
            out[name] = out.pop(vllm_name)
    for name, why in NO_EFFECT.items():
        if name in out:
            out.pop(name)
            if name not in _logged:
                _logged.add(name)
                logger.info("option %s accepted, no effect: %s", name, why)
    for name, (allowed, why) in ONLY_DEFAULT.items():
        if name in out:
            value = out.pop(name)
            if not allowed(value):
                raise ValueError(f"{name}={value!r} is not supported: {why}")
    return out
