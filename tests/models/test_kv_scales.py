"""Calibrated KV-cache scales in checkpoints (layers/kv_scales.py): every name format the quantization
tools write is recognised and lands on its layer; an fp8 cache stores ``k / k_scale``; a cache of the
model's dtype ignores them, so such a checkpoint loads and generates the same tokens as without them."""

from __future__ import annotations

import shutil

import pytest
import torch
from safetensors.torch import save_file

from aioinfer import LLM, SamplingParams
from aioinfer.attention.context import forward_context
from aioinfer.attention.fp8_kv import FP8_DTYPE, quantize, raw_bytes
from aioinfer.layers.kv_scales import kv_scale_target, scale_value
from aioinfer.models.loader import load_model
from attn_helpers import allocate_kv_cache, make_metadata, positions_for
from tiny_models import make_tiny_model_dir


@pytest.mark.parametrize("name, target", [
    ("model.layers.3.self_attn.k_scale", (3, "k")),  # vLLM's, llm-compressor's older output
    ("model.layers.3.self_attn.v_scale", (3, "v")),
    ("model.layers.0.self_attn.attn.k_scale", (0, "k")),  # vLLM's module path
    ("model.layers.12.self_attn.k_proj.k_scale", (12, "k")),  # NVIDIA ModelOpt
    ("model.layers.12.self_attn.v_proj.v_scale", (12, "v")),
    ("model.layers.7.self_attn.k_proj.output_scale", (7, "k")),  # compressed-tensors kv_cache_scheme
    ("model.layers.7.self_attn.v_proj.output_scale", (7, "v")),
    ("model.layers.1.self_attn.kv_scale", (1, "kv")),  # older: one scale for both
    ("model.layers.1.self_attn.q_scale", (1, "")),  # query / probability scales: recognised, dropped
    ("model.layers.1.self_attn.q_proj.output_scale", (1, "")),
    ("model.layers.1.self_attn.attn.prob_scale", (1, "")),
    ("model.layers.1.self_attn.k_proj.weight", None),  # weights and their quantization scales: not ours
    ("model.layers.1.self_attn.k_proj.weight_scale", None),
    ("model.layers.1.self_attn.k_proj.input_scale", None),
    ("model.layers.1.mlp.down_proj.output_scale", None),
])
def test_scale_names(name, target):
    assert kv_scale_target(name) == target


def test_scale_values():
    assert scale_value("s", torch.tensor(0.25)) == 0.25
    assert scale_value("s", torch.tensor([0.5], dtype=torch.bfloat16)) == 0.5
    assert scale_value("s", torch.tensor([0.1, 0.3, 0.2])) == pytest.approx(0.3)  # per head: the largest
    for bad in (torch.tensor(0.0), torch.tensor([-1.0]), torch.tensor(float("inf")), torch.tensor([])):
        with pytest.raises(ValueError, match="'s'"):
            scale_value("s", bad)


SCALES = {  # layer 0 in compressed-tensors' names, layer 1 in ModelOpt's and vLLM's older one
    "model.layers.0.self_attn.k_proj.output_scale": torch.tensor([0.02]),
    "model.layers.0.self_attn.v_proj.output_scale": torch.tensor([0.03]),
    "model.layers.0.self_attn.q_proj.output_scale": torch.tensor([0.5]),
    "model.layers.1.self_attn.kv_scale": torch.tensor(0.05),
    "model.layers.1.self_attn.v_proj.v_scale": torch.tensor(0.04),
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """(the tiny model, the same with the calibrated scales of SCALES in a shard of their own)."""
    plain = make_tiny_model_dir(tmp_path_factory.mktemp("plain"), arch="qwen2")
    scaled = tmp_path_factory.mktemp("scaled") / "model"
    shutil.copytree(plain, scaled)
    save_file(SCALES, str(scaled / "kv_scales.safetensors"))
    return plain, scaled


def test_scales_land_on_their_layers(folders):
    _, scaled = folders
    model, _ = load_model(str(scaled), torch.float32, "cpu")
    layers = model.attention_layers()
    assert (layers[0].k_scale, layers[0].v_scale) == pytest.approx((0.02, 0.03))
    assert layers[1].k_scale == pytest.approx(0.05)
    assert layers[1].v_scale == pytest.approx(0.04)  # kv_scale's, then v_proj.v_scale's (file order)
    plain, _ = load_model(str(folders[0]), torch.float32, "cpu")
    assert all((a.k_scale, a.v_scale) == (1.0, 1.0) for a in plain.attention_layers())  # vLLM's default


def test_fp8_cache_stores_k_over_k_scale(folders):
    """Layer 0's K and V depend on the embedding alone, so a float32 cache holds exactly what the fp8
    cache must hold quantized with layer 0's scales."""
    _, scaled = folders
    model, _ = load_model(str(scaled), torch.float32, "cpu")
    seqs = [(0, 23, [3, 1])]
    md = make_metadata(seqs, 16)
    ids = torch.randint(0, 400, (23,), generator=torch.Generator().manual_seed(0))
    caches = {}
    for dtype in (torch.float32, FP8_DTYPE):
        allocate_kv_cache(model, 4, 16, dtype)
        with forward_context(md), torch.no_grad():
            model(ids, positions_for(seqs))
        caches[dtype] = model.attention_layers()[0].kv_cache
    (k32, v32), (k8, v8) = caches[torch.float32], caches[FP8_DTYPE]
    assert k8.dtype == FP8_DTYPE
    assert torch.equal(raw_bytes(k8), raw_bytes(quantize(k32, 0.02)))
    assert torch.equal(raw_bytes(v8), raw_bytes(quantize(v32, 0.03)))
    assert not torch.equal(raw_bytes(k8), raw_bytes(quantize(k32, 1.0)))  # the scale was applied


def test_scales_are_ignored_by_a_cache_of_the_model_s_dtype(folders):
    plain, scaled = folders
    prompts = [[5, 6, 7, 8, 9, 10, 11], [100, 200, 300]]
    params = SamplingParams(temperature=0, max_tokens=8)
    runs = {}
    for name, path in (("plain", plain), ("scaled", scaled)):
        llm = LLM(model=str(path), dtype="float32", device="cpu", num_kv_blocks=16)
        runs[name] = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert runs["plain"] == runs["scaled"]
    fp8 = LLM(model=str(scaled), dtype="float32", device="cpu", num_kv_blocks=16, kv_cache_dtype="fp8")
    assert fp8.engine.executor.runner.kv_caches[0][0].dtype == FP8_DTYPE
    out = fp8.generate(prompts, params, use_tqdm=False)
    assert all(len(o.outputs[0].token_ids) == 8 for o in out)
