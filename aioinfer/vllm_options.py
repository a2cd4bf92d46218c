"""vLLM's ``LLM`` / engine keyword arguments that aioinfer spells differently, accepts without effect,
or refuses with the reason (docs/vllm_compatibility.md has the table).

``EngineConfig.from_kwargs`` runs ``translate`` first, so ``LLM``, ``Engine`` and
``DataParallelEngine`` take a vLLM script's options: a renamed one under aioinfer's name; one that
changes nothing here is dropped (one log line per option and process); one whose value would
change the result, but which aioinfer does not implement, is a ``ValueError`` naming it, never a
silent difference. Unknown options stay a ``TypeError`` (EngineConfig.from_kwargs).

``aioinfer serve`` and ``EngineArgs`` take the same options as vLLM's flags (``VLLM_ENGINE_FLAGS``, built
into flags by option_flags.py), with the same reasons: one table, so that a script and a command
line are told the same thing.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional

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
    "cpu_offload_gb": (_only(0, 0.0, None), "weights are not offloaded to the CPU"),
    "pipeline_parallel_size": (_only(1, None), "only tensor and data parallelism exist"),
    "enable_lora": (_only(False, None), "LoRA adapters are not supported"),
    "enable_chunked_prefill": (_only(True, None), "prefill is always chunked within the step's token budget"),
    "tokenizer_mode": (_only("auto", "hf", None), "the Hugging Face (fast) tokenizer is the only one"),
    "skip_tokenizer_init": (_only(False, None), "the tokenizer is always loaded when the model has one"),
    "revision": (_only(None, "main"), "models are loaded from local files; pick the revision when downloading"),
    "tokenizer_revision": (_only(None, "main"), "models are loaded from local files"),
    "distributed_executor_backend": (_only(None, "mp"), "tensor-parallel ranks are local processes (mp)"),
    "reasoning_parser": (_only(None, ""), "reasoning parsers are not implemented yet: a model's reasoning "
                                         "stays in the reply's content"),
}

# Structured outputs have one backend here, llguidance: vLLM calls it "guidance". "auto" lets vLLM pick
# per request; here it picks the one there is.
STRUCTURED_OUTPUTS_BACKENDS = ("auto", "guidance")
# vLLM's StructuredOutputsConfig keys besides ``backend``: (check, reason when refused)
_STRUCTURED_OUTPUTS_KEYS: dict[str, tuple[Callable[[Any], bool], str]] = {
    # one backend: there is nothing to fall back to, whatever the value
    "disable_fallback": (lambda value: isinstance(value, bool), "must be true or false"),
    # on by default (structured_output/closed_objects.py); either value is the server's
    # --[no-]disable-additional-properties (serve_flags.py takes it from here); offline only true, the
    # default (_offline_structured_outputs_config): a request sets false in its own params
    "disable_additional_properties": (lambda value: isinstance(value, bool), "must be true or false"),
    "disable_any_whitespace": (_only(False), "a server-wide default is not implemented; a request sets it "
                                             "(structured_outputs.disable_any_whitespace)"),
    "reasoning_parser": (_only("", None), "reasoning parsers are not implemented yet"),
    "reasoning_parser_plugin": (_only("", None), "reasoning parsers are not implemented yet"),
    "enable_in_reasoning": (_only(False), "reasoning parsers are not implemented yet"),
}


def check_structured_outputs_backend(name: Any) -> None:
    """vLLM's ``structured_outputs_config.backend`` (and the older ``guided_decoding_backend``, whose
    ``name:option`` form is taken too): ValueError unless it names the backend aioinfer has."""
    backend, _, options = str(name).partition(":")
    if backend not in STRUCTURED_OUTPUTS_BACKENDS:
        raise ValueError(f"structured outputs backend {name!r} is not available: aioinfer's is llguidance, "
                         f"vLLM's 'guidance' (give {' or '.join(map(repr, STRUCTURED_OUTPUTS_BACKENDS))})")
    for option in filter(None, options.split(",")):
        if option != "no-fallback":  # one backend: nothing to fall back to
            raise ValueError(f"structured outputs backend option {option!r} is not supported")


def check_structured_outputs_config(value: Any) -> dict:
    """vLLM's ``structured_outputs_config``: None, a dict of its keys, or that dict as JSON (the CLI's
    form); returned as a dict. ValueError naming the key for a backend aioinfer does not have or a
    setting it would not honour; every accepted key but ``disable_additional_properties`` (the
    server's setting of that name) changes nothing."""
    if value is None:
        return {}
    if isinstance(value, str):
        import json

        try:
            parsed = json.loads(value)
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict):
            raise ValueError(f"structured_outputs_config must be a JSON object such as '{{\"backend\": "
                             f"\"guidance\"}}', got {value!r}")
        value = parsed
    if not isinstance(value, dict):
        raise ValueError(f"structured_outputs_config must be a dict (or its JSON), got {value!r}")
    for key, item in value.items():
        if key == "backend":
            check_structured_outputs_backend(item)
            continue
        if key not in _STRUCTURED_OUTPUTS_KEYS:
            raise ValueError(f"structured_outputs_config has an unknown key {key!r}; known: "
                             f"{sorted(['backend', *_STRUCTURED_OUTPUTS_KEYS])}")
        allowed, why = _STRUCTURED_OUTPUTS_KEYS[key]
        if not allowed(item):
            raise ValueError(f"structured_outputs_config.{key}={item!r} is not supported: {why}")
    return value


def _offline_structured_outputs_config(value: Any) -> None:
    """``LLM(structured_outputs_config=...)``: as the server's, but ``disable_additional_properties``
    can only be its default (true) offline, where there is no server-wide setting to change."""
    if check_structured_outputs_config(value).get("disable_additional_properties", True) is not True:
        raise ValueError("structured_outputs_config.disable_additional_properties=False is not supported offline: "
                         "set it per request (StructuredOutputsParams(disable_additional_properties=False))")


# Options checked by a function of their own (ValueError with the reason), no effect once accepted.
CHECKED: dict[str, Callable[[Any], None]] = {
    "structured_outputs_config": _offline_structured_outputs_config,
    "guided_decoding_backend": check_structured_outputs_backend,  # vLLM's older name for the backend
}


# vLLM's engine options above as flags: option -> (value type, short forms, help; None: a generic line).
# bool: a --x / --no-x switch; another callable: a parser of its own (vLLM's JSON argument), which checks too.
VLLM_ENGINE_FLAGS: dict[str, tuple[Any, tuple[str, ...], Optional[str]]] = {
    "trust_remote_code": (bool, (), "accepted for vLLM's command lines; no effect (no model code is ever "
                                    "downloaded)"),
    "enable_chunked_prefill": (bool, (), "accepted; prefill is always chunked within the step's token budget "
                                         "(--no-enable-chunked-prefill is refused)"),
    "disable_log_stats": (bool, (), "accepted; no effect (no periodic stats lines are logged; /metrics is "
                                    "always served)"),
    "disable_custom_all_reduce": (bool, (), None),
    "enable_lora": (bool, (), None),
    "skip_tokenizer_init": (bool, (), None),
    "cpu_offload_gb": (float, (), None),
    "pipeline_parallel_size": (int, ("-pp",), None),
    "tokenizer_mode": (str, (), None),
    "revision": (str, (), None),
    "tokenizer_revision": (str, (), None),
    "distributed_executor_backend": (str, (), None),
    "download_dir": (str, (), None),
    "scheduling_policy": (str, (), None),
    "max_seq_len_to_capture": (int, (), None),
    "reasoning_parser": (str, (), "not implemented yet: refused"),
    # vLLM's JSON; also its dotted .backend (option_flags.py)
    "structured_outputs_config": (check_structured_outputs_config, (), "vLLM's JSON, checked: backend auto or "
                                  "guidance (llguidance, the one here); its disable_additional_properties sets "
                                  "--[no-]disable-additional-properties"),
    "guided_decoding_backend": (str, (), "vLLM's older flag: auto or guidance (llguidance, the one here)"),
}


def refusal(name: str, value: Any) -> Optional[str]:
    """Why ``name=value`` is refused (an ONLY_DEFAULT option away from what aioinfer does), or None."""
    if name in ONLY_DEFAULT:
        allowed, why = ONLY_DEFAULT[name]
        return None if allowed(value) else why
    if name in CHECKED:
        try:
            CHECKED[name](value)
        except ValueError as exc:
            return str(exc)
    return None

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
    for name, check in CHECKED.items():
        if name in out:
            check(out.pop(name))
    return out
