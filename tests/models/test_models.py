"""Our model definitions, loaded through our loader, against transformers on the same tiny folders."""

from __future__ import annotations

import pytest
import torch

from aioinfer.attention.context import forward_context
from aioinfer.layers.rotary import compute_inv_freq
from aioinfer.models.arch_config import ArchConfig
from aioinfer.models.loader import load_model
from attn_helpers import allocate_kv_cache, make_metadata, positions_for, shuffled_blocks
from tiny_models import make_tiny_model_dir

ATOL = 1e-4

VARIANTS = {
    "qwen2": ("qwen2", {}),
    "llama": ("llama", {}),
    "qwen3": ("qwen3", {}),
    "llama-linear": ("llama", {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}}),
    "llama-llama3": (
        "llama",
        {
            "rope_parameters": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
                "rope_theta": 10000.0,
            }
        },
    ),
    "qwen2-yarn": (
        "qwen2",
        {
            "rope_parameters": {
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 128,
                "rope_theta": 1000000.0,
            }
        },
    ),
}


@pytest.fixture(scope="module")
def tiny_root(tmp_path_factory):
    return tmp_path_factory.mktemp("tiny_models")


@pytest.fixture(scope="module", params=list(VARIANTS))
def pair(request, tiny_root):
    """(our model, transformers' model) loaded from the same folder, float32."""
    from transformers import AutoModelForCausalLM

    arch, overrides = VARIANTS[request.param]
    path = make_tiny_model_dir(tiny_root, arch, **overrides)
    ours, cfg = load_model(str(path), torch.float32, "cpu")
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return ours, hf


def _run(model, ids_per_seq, seqs, block_size):
    """Run one step: seqs = [(num_computed, num_new, blocks)], ids_per_seq = the new token ids of each."""
    md = make_metadata(seqs, block_size)
    ids = torch.tensor([t for ids in ids_per_seq for t in ids], dtype=torch.int64)
    with forward_context(md), torch.no_grad():
        return model.compute_logits(model(ids, positions_for(seqs)))


def _hf_logits(hf, ids):
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0].float()


def _prompt(n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 400, (n,), generator=g).tolist()


@pytest.mark.parametrize("block_size", [4, 16])
def test_full_prompt_logits_match_transformers(pair, block_size):
    ours, hf = pair
    ids = _prompt(23, 0)
    nb = -(-len(ids) // block_size)
    allocate_kv_cache(ours, nb + 4, block_size, torch.float32)
    blocks = shuffled_blocks(nb + 4, 1)[:nb]
    logits = _run(ours, [ids], [(0, len(ids), blocks)], block_size)
    assert logits.dtype == torch.float32 and logits.shape == (len(ids), ours.config.vocab_size)
    torch.testing.assert_close(logits, _hf_logits(hf, ids), atol=ATOL, rtol=0)


def test_chunked_prefill_and_decode_match_one_pass(pair):
    ours, hf = pair
    bs = 4
    ids = _prompt(23, 2)
    ref = _hf_logits(hf, ids)
    blocks = shuffled_blocks(10, 3)[:6]
    allocate_kv_cache(ours, 10, bs, torch.float32)
    first = _run(ours, [ids[:10]], [(0, 10, blocks[:3])], bs)
    second = _run(ours, [ids[10:22]], [(10, 12, blocks)], bs)
    third = _run(ours, [ids[22:]], [(22, 1, blocks)], bs)  # a decode step
    torch.testing.assert_close(torch.cat([first, second, third]), ref, atol=ATOL, rtol=0)


def test_two_sequences_in_one_batch_match_each_alone(pair):
    ours, hf = pair
    bs = 4
    a, b = _prompt(7, 4), _prompt(18, 5)
    perm = shuffled_blocks(12, 6)
    allocate_kv_cache(ours, 12, bs, torch.float32)
    both = _run(ours, [a, b], [(0, len(a), perm[:2]), (0, len(b), perm[2:7])], bs)
    torch.testing.assert_close(both[: len(a)], _hf_logits(hf, a), atol=ATOL, rtol=0)
    torch.testing.assert_close(both[len(a) :], _hf_logits(hf, b), atol=ATOL, rtol=0)
    # Then one decode token for each in the same batch, against a full pass over the longer prompts.
    nxt_a, nxt_b = [11], [12]
    step = _run(ours, [nxt_a, nxt_b], [(len(a), 1, perm[:2]), (len(b), 1, perm[2:7])], bs)
    torch.testing.assert_close(step[0], _hf_logits(hf, a + nxt_a)[-1], atol=ATOL, rtol=0)
    torch.testing.assert_close(step[1], _hf_logits(hf, b + nxt_b)[-1], atol=ATOL, rtol=0)


def test_model_exposes_cache_shape(pair):
    ours, hf = pair
    cfg = hf.config
    assert ours.num_layers == cfg.num_hidden_layers == len(ours.attention_layers())
    assert ours.num_kv_heads == cfg.num_key_value_heads
    assert ours.head_dim == getattr(cfg, "head_dim", cfg.hidden_size // cfg.num_attention_heads)
    assert all(hasattr(a, "kv_cache") for a in ours.attention_layers())


def test_no_cache_prefill_matches(tiny_root):
    """With no KV cache set (profiling runs), a full prefill still gives the right logits."""
    path = make_tiny_model_dir(tiny_root, "qwen2")
    ours, _ = load_model(path, torch.float32, "cpu")
    ids = _prompt(9, 7)
    allocate_kv_cache(ours, 4, 4, torch.float32)
    with_cache = _run(ours, [ids], [(0, 9, [2, 0, 3])], 4)
    for attn in ours.attention_layers():
        attn.kv_cache = None
    torch.testing.assert_close(_run(ours, [ids], [(0, 9, [2, 0, 3])], 4), with_cache, atol=1e-6, rtol=0)


def test_bfloat16_load_runs(tiny_root):
    path = make_tiny_model_dir(tiny_root, "llama")
    ours, _ = load_model(path, torch.bfloat16, "cpu")
    assert all(p.dtype == torch.bfloat16 for p in ours.parameters())
    allocate_kv_cache(ours, 4, 16, torch.bfloat16)
    logits = _run(ours, [_prompt(5, 8)], [(0, 5, [1])], 16)
    assert logits.dtype == torch.float32 and torch.isfinite(logits).all()


# ---- RoPE frequencies against transformers' own init functions ------------------------------------

ROPE_CASES = [
    {"rope_type": "linear", "factor": 4.0},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 8192},
    {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 512},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
    {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 4096, "beta_fast": 16, "beta_slow": 2,
     "truncate": False},
    {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096, "mscale": 1.0,
     "mscale_all_dim": 0.707},
    {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 4096, "attention_factor": 1.3},
]


@pytest.mark.parametrize("params", ROPE_CASES, ids=lambda p: p["rope_type"])
def test_inv_freq_matches_transformers(params):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    d = dict(hidden_size=512, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
             num_hidden_layers=1, vocab_size=16, max_position_embeddings=131072,
             rope_parameters={"rope_theta": 500000.0, **params})
    hf_inv, hf_scale = ROPE_INIT_FUNCTIONS[params["rope_type"]](LlamaConfig(**d))
    cfg = ArchConfig.from_hf_dict({**d, "model_type": "llama"})
    ours_inv, ours_scale = compute_inv_freq(cfg.rope, cfg.head_dim, cfg.max_position_embeddings)
    torch.testing.assert_close(ours_inv, hf_inv.float(), atol=0, rtol=0)
    assert ours_scale == pytest.approx(hf_scale)


# ---- ArchConfig parsing --------------------------------------------------------------------------

_BASE = dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=100, hidden_size=64,
             intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=4096)


def test_arch_config_old_and_new_rope_keys_agree():
    old = ArchConfig.from_hf_dict({**_BASE, "rope_theta": 5e5,
                                   "rope_scaling": {"type": "linear", "factor": 2.0}})
    new = ArchConfig.from_hf_dict({**_BASE, "rope_parameters": {"rope_theta": 5e5, "rope_type": "linear",
                                                                "factor": 2.0}})
    assert old == new
    assert old.rope.rope_type == "linear" and old.rope_theta == 5e5 and old.rope.factor == 2.0
    assert old.num_kv_heads == 4 and old.head_dim == 16  # defaults: kv heads = heads, head_dim = hidden/heads


def test_arch_config_fields():
    llama3 = ArchConfig.from_hf_dict({**_BASE, "rope_theta": 5e5, "rope_scaling": {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}})
    assert llama3.rope.original_max_position_embeddings == 4096  # transformers' fallback
    q2 = ArchConfig.from_hf_dict({**_BASE, "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
                                  "num_key_value_heads": 2, "tie_word_embeddings": True, "eos_token_id": [5, 6],
                                  "torch_dtype": "bfloat16", "rms_norm_eps": 1e-5})
    assert q2.qkv_bias and not q2.o_bias and q2.tie_word_embeddings and q2.eos_token_ids == (5, 6)
    assert q2.dtype == "bfloat16" and q2.rms_norm_eps == 1e-5 and q2.rope.rope_type == "default"
    assert q2.rope_theta == 10000.0
    l_bias = ArchConfig.from_hf_dict({**_BASE, "attention_bias": True, "eos_token_id": 2, "head_dim": 32})
    assert l_bias.qkv_bias and l_bias.o_bias and l_bias.eos_token_ids == (2,) and l_bias.head_dim == 32
    with pytest.raises(ValueError, match="rope_type"):
        ArchConfig.from_hf_dict({**_BASE, "rope_scaling": {"rope_type": "longrope"}})
