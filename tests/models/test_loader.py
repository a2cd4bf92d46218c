"""Checkpoint discovery and loading: multi-shard safetensors, dummy weights, GGUF, errors."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from aioinfer.attention.context import forward_context
from aioinfer.models.loader import (
    ModelSource,
    load_arch_config,
    load_generation_defaults,
    load_model,
    resolve_model_source,
)
from attn_helpers import allocate_kv_cache, make_metadata, positions_for
from tiny_models import make_tiny_model_dir


@pytest.fixture(scope="module")
def tiny_root(tmp_path_factory):
    return tmp_path_factory.mktemp("tiny_loader")


def _logits(model, ids, block_size=16):
    seqs = [(0, len(ids), list(range(-(-len(ids) // block_size))))]
    allocate_kv_cache(model, len(seqs[0][2]), block_size, next(model.parameters()).dtype)
    with forward_context(make_metadata(seqs, block_size)), torch.no_grad():
        return model.compute_logits(model(torch.tensor(ids), positions_for(seqs)))


def _state(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_multi_shard_safetensors_loads_identically(tiny_root, tmp_path):
    from transformers import AutoModelForCausalLM

    single = make_tiny_model_dir(tiny_root, "llama")
    hf = AutoModelForCausalLM.from_pretrained(single, dtype=torch.float32)
    sharded = tmp_path / "sharded"
    hf.save_pretrained(sharded, max_shard_size="40KB")
    assert (sharded / "model.safetensors.index.json").is_file()
    assert len(list(sharded.glob("*.safetensors"))) > 2
    a, _ = load_model(str(single), torch.float32, "cpu")
    b, _ = load_model(str(sharded), torch.float32, "cpu", load_format="safetensors")
    sa, sb = _state(a), _state(b)
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


def test_tied_embeddings_share_storage(tiny_root):
    model, cfg = load_model(make_tiny_model_dir(tiny_root, "qwen2"), torch.float32, "cpu")
    assert cfg.tie_word_embeddings
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_dummy_from_config_alone(tiny_root, tmp_path):
    src = make_tiny_model_dir(tiny_root, "qwen2")
    cfg_only = tmp_path / "cfg_only"
    cfg_only.mkdir()
    shutil.copy(src / "config.json", cfg_only / "config.json")
    m1, cfg = load_model(str(cfg_only), torch.bfloat16, "cpu", load_format="dummy", seed=3)
    m2, _ = load_model(str(cfg_only), torch.bfloat16, "cpu", load_format="dummy", seed=3)
    m3, _ = load_model(str(cfg_only), torch.bfloat16, "cpu", load_format="dummy", seed=4)
    ids = [5, 9, 200, 7]
    l1, l2, l3 = _logits(m1, ids), _logits(m2, ids), _logits(m3, ids)
    assert torch.isfinite(l1).all() and l1.std() > 0
    assert torch.equal(l1, l2) and not torch.equal(l1, l3)
    with pytest.raises(ValueError, match="safetensors|lacks"):
        # no weights in the folder: loading for real must fail loudly
        try:
            load_model(str(cfg_only), torch.float32, "cpu")
        except FileNotFoundError as e:
            raise ValueError(str(e)) from e


def test_missing_weight_is_an_error(tiny_root, tmp_path):
    from safetensors.torch import load_file, save_file

    src = make_tiny_model_dir(tiny_root, "llama")
    broken = tmp_path / "broken"
    broken.mkdir()
    shutil.copy(src / "config.json", broken / "config.json")
    tensors = load_file(src / "model.safetensors")
    del tensors["lm_head.weight"]  # llama tiny is untied, so this one is required
    save_file(tensors, broken / "model.safetensors")
    with pytest.raises(ValueError, match="lm_head.weight"):
        load_model(broken, torch.float32, "cpu")


def test_resolve_and_errors(tiny_root, tmp_path):
    folder = make_tiny_model_dir(tiny_root, "qwen2")
    src = resolve_model_source(str(folder))
    assert src == ModelSource("hf", folder.resolve()) and src.folder == folder.resolve()
    assert load_arch_config(src).architecture == "Qwen2ForCausalLM"
    with pytest.raises(FileNotFoundError, match="config.json"):
        resolve_model_source(str(tmp_path / "does-not-exist"))
    with pytest.raises(FileNotFoundError, match="config.json"):
        resolve_model_source(str(tmp_path))  # empty folder
    with pytest.raises(FileNotFoundError, match="GGUF"):
        resolve_model_source(str(tmp_path / "missing.gguf"))
    stray = tmp_path / "weights.bin"
    stray.write_bytes(b"x")
    with pytest.raises(ValueError, match="neither"):
        resolve_model_source(str(stray))
    with pytest.raises(ValueError, match="load_format"):
        load_model(src, torch.float32, "cpu", load_format="pt")
    with pytest.raises(ValueError, match="gguf"):
        load_model(src, torch.float32, "cpu", load_format="gguf")
    bad_arch = tmp_path / "bad_arch"
    bad_arch.mkdir()
    cfg = json.loads((folder / "config.json").read_text())
    cfg["architectures"] = ["MambaForCausalLM"]
    (bad_arch / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="unsupported architecture"):
        load_model(bad_arch, torch.float32, "cpu", load_format="dummy")


def test_generation_defaults(tiny_root, tmp_path):
    src = resolve_model_source(make_tiny_model_dir(tiny_root, "llama"))
    d = load_generation_defaults(src)
    assert d["eos_token_id"] == [2, 0] and d["temperature"] == 0.7 and d["top_k"] == 20 and d["top_p"] == 0.8
    (tmp_path / "config.json").write_text((src.path / "config.json").read_text())
    assert load_generation_defaults(resolve_model_source(tmp_path)) == {}
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 7, "max_new_tokens": 64}))
    assert load_generation_defaults(resolve_model_source(tmp_path)) == {"eos_token_id": [7], "max_new_tokens": 64}


@pytest.mark.slow
def test_gguf_smollm2_matches_transformers(request):
    try:
        gguf_path = request.getfixturevalue("smollm2_gguf")
    except pytest.FixtureLookupError:
        pytest.skip("smollm2_gguf fixture (tests/conftest.py) not available")
    from transformers import AutoModelForCausalLM

    src = resolve_model_source(str(gguf_path))
    assert src.kind == "gguf"
    ours, cfg = load_model(src, torch.float32, "cpu")
    assert (cfg.architecture, cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads) == (
        "LlamaForCausalLM", 30, 576, 9, 3)
    assert cfg.vocab_size == 49152 and cfg.tie_word_embeddings and cfg.rope_theta == 100000.0
    assert cfg.eos_token_ids == (2,) and cfg.bos_token_id == 1
    ids = [1, 504, 2365, 6354, 16438, 27003, 690, 260, 23790, 2767, 30]
    got = _logits(ours, ids, block_size=4)
    del ours
    hf = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0].float()
    assert (got - ref).abs().max().item() < 1e-3
    assert torch.equal(got.argmax(-1), ref.argmax(-1))
