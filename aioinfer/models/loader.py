"""Find a checkpoint, read its ArchConfig and generation defaults, and build a loaded model.

The model is built on the meta device, materialised with ``to_empty`` directly in the target
dtype/device, and filled tensor by tensor from the checkpoint, so peak memory is the model plus one
tensor.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch

from aioinfer.attention.backend import AttentionBackend
from aioinfer.distributed.group import TPGroup
from aioinfer.layers.quantization.config import QuantConfig, quant_config
from aioinfer.layers.quantization.fp8_linear import finish_quantized, quantize_linears
from aioinfer.models.arch_config import ArchConfig, check_attention_window
from aioinfer.models.decoder import DecoderForCausalLM
from aioinfer.models.registry import get_model_class

LOAD_FORMATS = ("auto", "safetensors", "gguf", "dummy")


@dataclass(frozen=True, slots=True)
class ModelSource:
    """Where a model lives: an HF folder (config.json + safetensors) or one GGUF file."""

    kind: str  # "hf" | "gguf"
    path: Path  # the folder for "hf", the .gguf file for "gguf"
    # The parsed GGUF (a gguf.GGUFReader) once ``open_model_source`` read it, else None. Parsing a
    # GGUF's metadata takes seconds (SmolLM2's 49k tokens and 48k merges), so one load parses it
    # once and the arch config, the weights and the tokenizer all read that one.
    gguf: Any = field(default=None, compare=False, repr=False)

    @property
    def folder(self) -> Path:
        """The folder holding tokenizer / generation_config files."""
        return self.path if self.kind == "hf" else self.path.parent


def resolve_model_source(model: str | Path) -> ModelSource:
    """Classify ``model``: a folder with config.json -> HF; a ``.gguf`` file (or a folder holding exactly
    one .gguf and no config.json) -> GGUF. Anything else raises FileNotFoundError / ValueError."""
    path = Path(model).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise FileNotFoundError(f"GGUF file not found: {path}")
        return ModelSource("gguf", path.resolve())
    if path.is_dir():
        if (path / "config.json").is_file():
            return ModelSource("hf", path.resolve())
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return ModelSource("gguf", ggufs[0].resolve())
        if len(ggufs) > 1:
            raise ValueError(f"{path} holds several .gguf files; pass one of them: {[g.name for g in ggufs]}")
        raise FileNotFoundError(f"{path} is a folder but has no config.json (HF model) and no .gguf file")
    if path.exists():
        raise ValueError(f"{path} is neither an HF model folder (with config.json) nor a .gguf file")
    raise FileNotFoundError(
        f"model {str(model)!r} not found: expected a local HF folder with config.json or a path to a .gguf file"
    )


def open_model_source(model: "str | Path | ModelSource") -> ModelSource:
    """``resolve_model_source``, with a GGUF's metadata parsed now, once, for every reader of this load."""
    source = model if isinstance(model, ModelSource) else resolve_model_source(model)
    if source.kind != "gguf" or source.gguf is not None:
        return source
    from aioinfer.models.gguf_loader import open_gguf

    return dataclasses.replace(source, gguf=open_gguf(source.path))


def _gguf_reader(source: ModelSource) -> Any:
    if source.gguf is not None:
        return source.gguf
    from aioinfer.models.gguf_loader import open_gguf

    return open_gguf(source.path)


def load_arch_config(source: ModelSource) -> ArchConfig:
    if source.kind == "hf":
        return ArchConfig.from_hf_dict(json.loads((source.path / "config.json").read_text()))
    from aioinfer.models.gguf_loader import arch_config_from_gguf

    return arch_config_from_gguf(_gguf_reader(source))


def load_generation_defaults(source: ModelSource) -> dict[str, Any]:
    """Sampling defaults the checkpoint suggests (generation_config.json); {} when there is none.

    Keys present only if set: eos_token_id (list[int]), temperature, top_p, top_k,
    repetition_penalty, max_new_tokens.
    """
    return read_generation_config(source.folder)


def read_generation_config(folder: Path) -> dict[str, Any]:
    """``load_generation_defaults`` for the generation_config.json in ``folder`` ({} without one)."""
    path = Path(folder) / "generation_config.json"
    if not path.is_file():
        return {}
    raw = json.loads(path.read_text())
    out: dict[str, Any] = {}
    eos = raw.get("eos_token_id")
    if eos is not None:
        out["eos_token_id"] = [int(e) for e in eos] if isinstance(eos, (list, tuple)) else [int(eos)]
    for key in ("temperature", "top_p", "top_k", "repetition_penalty", "max_new_tokens"):
        if raw.get(key) is not None:
            out[key] = raw[key]
    return out


def load_quant_config(source: ModelSource, quantization: Optional[str]) -> Optional[QuantConfig]:
    """The FP8 layout of ``source``'s linear layers under the engine's ``quantization`` option (None:
    plain weights). A GGUF carries no FP8 layout: only ``quantization="fp8"`` quantizes it."""
    hf = json.loads((source.path / "config.json").read_text()) if source.kind == "hf" else {}
    return quant_config(hf, quantization)


def _build_empty(cfg: ArchConfig, dtype: torch.dtype, device: torch.device, backend,
                 tp: Optional[TPGroup], quant: Optional[QuantConfig] = None) -> DecoderForCausalLM:
    cls = get_model_class(cfg.architecture)
    with torch.device("meta"):
        model = cls(cfg, backend, tp)
    model = model.to(dtype=dtype)  # free on meta: only metadata changes
    if quant is not None:
        quantize_linears(model, quant, device)  # FP8 weights and their scales, still on meta
    model.to_empty(device=device)
    model.tie_weights()  # to_empty re-creates parameters, which unties them
    model.reset_buffers()
    return model.eval()


@torch.no_grad()
def load_model(
    source: ModelSource | str | Path,
    dtype: torch.dtype,
    device: torch.device | str,
    load_format: str = "auto",
    attention_backend: Optional[AttentionBackend] = None,
    seed: int = 0,
    tp: Optional[TPGroup] = None,
    max_model_len: Optional[int] = None,
    quantization: Optional[str] = None,
) -> tuple[DecoderForCausalLM, ArchConfig]:
    """Build the model for ``source`` in ``dtype`` on ``device`` and fill its weights (a source from
    ``open_model_source`` lends its parsed GGUF; otherwise a GGUF is parsed here).

    load_format: "auto" (by source kind), "safetensors", "gguf", or "dummy" (random weights from
    the config alone, deterministic by ``seed``). With a tensor-parallel group ``tp`` the model
    holds this rank's shard of every split layer. ``max_model_len`` (tokens; None: the model's
    ``max_position_embeddings``, the engine's default) is the longest context the caller will run: a
    model whose sliding attention window is shorter is refused before any weight is read.
    ``quantization``: the engine option (None, "fp8", "compressed-tensors"); an FP8 checkpoint loads
    as FP8 whatever it says (layers/quantization/config.py).
    """
    if load_format not in LOAD_FORMATS:
        raise ValueError(f"load_format must be one of {LOAD_FORMATS}, got {load_format!r}")
    if not isinstance(source, ModelSource):
        source = resolve_model_source(source)
    device = torch.device(device)
    fmt = load_format if load_format != "auto" else ("gguf" if source.kind == "gguf" else "safetensors")
    if fmt == "safetensors" and source.kind != "hf":
        raise ValueError(f"load_format 'safetensors' needs an HF folder, got a GGUF file {source.path}")
    if fmt == "gguf" and source.kind != "gguf":
        raise ValueError(f"load_format 'gguf' needs a .gguf file, got an HF folder {source.path}")

    reader = None
    if source.kind == "gguf":
        from aioinfer.models.gguf_loader import arch_config_from_gguf

        reader = _gguf_reader(source)  # parsed once for both the config and the weights
        cfg = arch_config_from_gguf(reader)
    else:
        cfg = load_arch_config(source)
    check_attention_window(cfg, max_model_len or cfg.max_position_embeddings)
    quant = load_quant_config(source, quantization)

    model = _build_empty(cfg, dtype, device, attention_backend, tp, quant)
    if fmt == "dummy":
        from aioinfer.models.weight_utils import init_dummy_weights

        init_dummy_weights(model, seed)  # FP8 layers quantize these as they load, whatever the format
    else:
        if fmt == "gguf":
            from aioinfer.models.gguf_loader import iterate_gguf

            weights = iterate_gguf(reader, cfg)
        else:
            from aioinfer.models.weight_utils import iterate_safetensors

            weights = iterate_safetensors(source.path)
        loaded = model.load_weights(weights)
        expected = {n for n, _ in model.named_parameters()}  # tied lm_head appears once, as the embedding
        missing = sorted(expected - loaded)
        if missing:
            raise ValueError(f"checkpoint {source.path} lacks weights for: {missing[:8]}{' ...' if len(missing) > 8 else ''}")
    if quant is not None:
        finish_quantized(model)
    model.tie_weights()
    return model, cfg
