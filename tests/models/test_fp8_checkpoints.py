"""FP8 weights through the real loader: every on-disk format, online quantization, and refusals.

Each format (tests/fp8_checkpoints.py: compressed-tensors per channel / per tensor with static
activations / per block, HF ``fp8`` per block / per tensor static) is written by the test from a
tiny random Qwen2, Llama or Qwen3 model in the format's real safetensors layout and config block.
Checked:

- the loaded FP8 weights and scales, dequantized, equal the checkpoint's dequantized weights exactly
  (fused q/k/v and gate/up pieces each keep their own scales);
- the model's logits equal a float32 reference within 1e-4 relative to the logits' scale: the same
  model with the dequantized weights, whose linear layers see their inputs quantized as the FP8
  path quantizes them (per token, or with the static input scale, the largest of a fused layer's
  pieces; block-wise layers are weight-only on the CPU);
- ``quantization="fp8"`` on a plain checkpoint quantizes each weight per output row as it loads,
  then brings each layer to one scale, its rows' largest (equal to requantize_rows of quantize_rows
  of the checkpoint's weight), and its activations per tensor; a GGUF or dummy weights too;
- the engine generates with FP8 weights; unsupported schemes fail with the reason before loading.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from aioinfer.attention.context import forward_context
from aioinfer.layers.linear import Linear
from aioinfer.layers.quantization.config import QuantizationError, quant_config
from aioinfer.layers.quantization.fp8 import (FP8, dequantize_blocks, dequantize_rows, quantize_rows,
                                              quantize_tensor, requantize_rows)
from aioinfer.models.loader import load_model
from attn_helpers import allocate_kv_cache, make_metadata, positions_for
from fp8_checkpoints import BLOCK, FORMATS, input_scales, write_dequantized, write_fp8_checkpoint
from tiny_models import make_tiny_model_dir

ARCH_OF = {"ct-channel": "qwen2", "ct-tensor-static": "llama", "ct-block": "qwen3", "hf-block": "qwen2",
           "hf-tensor-static": "qwen3"}
IDS = [5, 9, 200, 7, 33, 100, 3, 250, 17, 64, 128, 300]
PIECES = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


@pytest.fixture(scope="module")
def tiny_root(tmp_path_factory):
    return tmp_path_factory.mktemp("tiny_fp8")


def _logits(model, ids=IDS, block_size=16):
    seqs = [(0, len(ids), list(range(-(-len(ids) // block_size))))]
    allocate_kv_cache(model, len(seqs[0][2]), block_size, torch.float32)
    with forward_context(make_metadata(seqs, block_size)), torch.no_grad():
        return model.compute_logits(model(torch.tensor(ids), positions_for(seqs)))


def _linears(model):
    return [(name, m) for name, m in model.named_modules() if isinstance(m, Linear)]


def _dequantized(layer) -> torch.Tensor:
    if layer.quant.block is not None:
        return dequantize_blocks(layer.weight, getattr(layer, layer.quant.block_scale), BLOCK)
    return dequantize_rows(layer.weight, layer.weight_scale)


def _quantize_inputs(model, static: dict[str, float], per_tensor: bool = False) -> None:
    """Make ``model``'s linear layers see their inputs as the FP8 path quantizes them."""
    for name, layer in _linears(model):
        if per_tensor:
            def hook(_module, args):
                q, s = quantize_tensor(args[0])
                return (q.to(torch.float32) * s,)
        elif static:
            prefix, _, leaf = name.rpartition(".")
            scale = torch.tensor(max(static[f"{prefix}.{p}"] for p in PIECES.get(leaf, (leaf,))))

            def hook(_module, args, scale=scale):
                q, s = quantize_tensor(args[0], scale)
                return (q.to(torch.float32) * s,)
        else:
            def hook(_module, args):
                q, s = quantize_rows(args[0])
                return (dequantize_rows(q, s),)
        layer.register_forward_pre_hook(hook)


@pytest.mark.parametrize("fmt", FORMATS)
def test_fp8_checkpoint_loads_and_matches_its_dequantized_reference(tiny_root, tmp_path, fmt):
    src = make_tiny_model_dir(tiny_root, ARCH_OF[fmt])
    fp8 = write_fp8_checkpoint(src, tmp_path / "fp8", fmt)
    ref_dir = write_dequantized(fp8, tmp_path / "ref")
    model, _ = load_model(str(fp8), torch.float32, "cpu")
    ref, _ = load_model(str(ref_dir), torch.float32, "cpu")

    ours, theirs = dict(_linears(model)), dict(_linears(ref))
    assert ours.keys() == theirs.keys() and len(ours) == 4 * len(model.model.layers)
    for name, layer in ours.items():
        assert layer.weight.dtype == FP8 and layer.quant is not None, name
        assert torch.equal(_dequantized(layer), theirs[name].weight), name

    block = fmt.endswith("block")
    if not block:  # block-wise layers are weight-only on the CPU: no activation quantization to mirror
        _quantize_inputs(ref, input_scales(fp8) if fmt.endswith("static") else {})
    a, b = _logits(model), _logits(ref)
    scale = b.abs().max().item()
    assert (a - b).abs().max().item() <= 1e-4 * scale, (fmt, (a - b).abs().max().item(), scale)
    # The static formats keep the largest input scale of a fused layer's pieces.
    if fmt.endswith("static"):
        qkv = model.model.layers[0].self_attn.qkv_proj
        assert qkv.input_scale.item() == pytest.approx(0.030)


@pytest.mark.parametrize("arch", ["qwen2", "llama", "qwen3"])
def test_online_fp8_quantizes_each_weight_tensor_as_it_loads(tiny_root, arch):
    src = make_tiny_model_dir(tiny_root, arch)
    model, _ = load_model(str(src), torch.float32, "cpu", quantization="fp8")
    ref, _ = load_model(str(src), torch.float32, "cpu")
    for (name, layer), (_, plain) in zip(_linears(model), _linears(ref)):
        q, s = quantize_rows(plain.weight)
        one = s.max()
        expected = requantize_rows(q, s.reshape(-1), one)
        assert torch.equal(layer.weight.view(torch.uint8), expected.view(torch.uint8)), name
        assert torch.equal(layer.weight_scale, one.expand(len(s))), name  # one scale for the layer
        assert "weight_scale" not in dict(layer.named_parameters())  # computed, not a checkpoint tensor
        # and the layer's weights stay within e4m3's rounding of the checkpoint's
        err = (dequantize_rows(layer.weight, layer.weight_scale) - plain.weight).abs()
        assert (err <= plain.weight.abs() / 8 + one * 2.0**-9).all(), name
        plain.weight.copy_(dequantize_rows(expected, layer.weight_scale))
    _quantize_inputs(ref, {}, per_tensor=True)
    a, b = _logits(model), _logits(ref)
    assert (a - b).abs().max().item() <= 1e-4 * b.abs().max().item()
    # the embedding, the head and the norms stay as they were
    assert model.model.embed_tokens.weight.dtype == torch.float32
    assert model.lm_head.weight.dtype == torch.float32


def test_online_fp8_padding_rows_do_not_set_the_activation_scale(tiny_root):
    """A CUDA-graph replay pads the step with rows whose KV slot is -1: the online layers' one
    activation scale per tensor must come from the real rows alone, so the real rows' outputs are
    those of the unpadded (eager) step, whatever the padding holds."""
    from dataclasses import replace

    src = make_tiny_model_dir(tiny_root, "qwen2")
    model, _ = load_model(str(src), torch.float32, "cpu", quantization="fp8")
    layer = model.model.layers[0].mlp.down_proj
    x = torch.randn(3, layer.in_features)
    padding = 100 * torch.randn(2, layer.in_features)  # stale rows, far larger than the real ones
    meta = make_metadata([(0, 5, [0])], 16)
    with forward_context(replace(meta, slot_mapping=torch.tensor([0, 1, 2, -1, -1]))), torch.no_grad():
        padded = layer(torch.cat([x, padding]))[:3]
    with forward_context(make_metadata([(0, 3, [0])], 16)), torch.no_grad():
        alone = layer(x)
    scale = alone.abs().max()
    assert (padded - alone).abs().max() <= 1e-6 * scale  # (the GEMM's blocking may differ with the row count)
    with torch.no_grad():  # outside a step every row counts: the padding would have coarsened the real rows
        assert (layer(torch.cat([x, padding]))[:3] - alone).abs().max() > 1e-3 * scale


def test_online_fp8_of_dummy_weights_and_of_the_checkpoint_formats(tiny_root, tmp_path):
    src = make_tiny_model_dir(tiny_root, "qwen2")
    cfg_only = tmp_path / "cfg_only"
    cfg_only.mkdir()
    shutil.copy(src / "config.json", cfg_only / "config.json")
    model, _ = load_model(str(cfg_only), torch.bfloat16, "cpu", load_format="dummy", quantization="fp8")
    layer = model.model.layers[0].mlp.down_proj
    assert layer.weight.dtype == FP8 and torch.isfinite(layer.weight_scale).all() and (layer.weight_scale > 0).all()
    assert torch.isfinite(_logits(model).float()).all()
    # dummy weights in a format that stores its scales (the benchmarks' shapes): quantized as they load
    for fmt in ("ct-tensor-static", "hf-block"):
        fp8 = write_fp8_checkpoint(src, tmp_path / fmt, fmt)
        model, _ = load_model(str(fp8), torch.float32, "cpu", load_format="dummy")
        assert torch.isfinite(_logits(model)).all(), fmt


PERPLEXITY_TEXT = (
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg combined "
    "movable metal type, oil-based ink and a wooden screw press into a system that could produce books "
    "quickly and cheaply. Before his invention, books were copied by hand, a slow process that made them "
    "rare and expensive. Within a few decades printing shops had spread across Europe, and the number of "
    "books in circulation grew from thousands to millions. Scholars could now compare identical copies of "
    "a text, errors were corrected in later editions, and new ideas travelled faster than ever before. "
    "The press also changed how people learned to read, since cheap pamphlets and almanacs reached "
    "merchants, craftsmen and farmers who had never owned a book."
)


def _perplexity(model, ids: list[int]) -> tuple[float, torch.Tensor]:
    logits = _logits(model, ids)
    logprobs = torch.log_softmax(logits[:-1].double(), dim=-1)
    nll = -logprobs.gather(1, torch.tensor(ids[1:])[:, None]).mean().item()
    return float(torch.exp(torch.tensor(nll))), logits.argmax(-1)


@pytest.mark.slow
def test_online_fp8_keeps_the_perplexity_of_real_models(smollm2_gguf, smollm2_tokenizer, qwen25_coder_gguf):
    """Real models (GGUFs, dequantized as they load) quantized to FP8 online, against themselves
    unquantized, on a fixed text: Qwen2.5-Coder-0.5B within 2 % (measured +0.7 %, 95 % argmax
    agreement); SmolLM2-135M within 8 % (measured +2.5 %: its weights are on Q4_1's 4-bit grid
    already, and a 135M model has little redundancy)."""
    from transformers import AutoTokenizer

    qwen_tokenizer = AutoTokenizer.from_pretrained(qwen25_coder_gguf.parent, gguf_file=qwen25_coder_gguf.name)
    for name, gguf, tokenizer, bound in (("Qwen2.5-Coder-0.5B", qwen25_coder_gguf, qwen_tokenizer, 0.02),
                                         ("SmolLM2-135M", smollm2_gguf, smollm2_tokenizer, 0.08)):
        ids = tokenizer.encode(PERPLEXITY_TEXT)
        plain, _ = load_model(str(gguf), torch.float32, "cpu")
        base, base_argmax = _perplexity(plain, ids)
        del plain
        fp8, _ = load_model(str(gguf), torch.float32, "cpu", quantization="fp8")
        assert fp8.model.layers[0].mlp.down_proj.weight.dtype == FP8
        got, got_argmax = _perplexity(fp8, ids)
        del fp8
        agreement = (base_argmax == got_argmax).float().mean().item()
        print(f"{name}, {len(ids)} tokens: perplexity {base:.3f} unquantized, {got:.3f} FP8 weights "
              f"({got / base - 1:+.2%}); argmax agreement {agreement:.1%}")
        assert abs(got / base - 1) <= bound, name


def test_unsupported_schemes_are_refused_with_the_reason():
    def ct(weights, acts=None, **extra):
        group = {"targets": ["Linear"], "weights": weights, "input_activations": acts}
        return {"quantization_config": {"quant_method": "compressed-tensors", "format": "float-quantized",
                                        "config_groups": {"g": group}, **extra}}

    w4 = {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128, "symmetric": True}
    fp8w = {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True, "dynamic": False}
    fp8a = {"num_bits": 8, "type": "float", "strategy": "token", "symmetric": True, "dynamic": True}
    cases = [
        (ct(w4), None, "4 bits"),
        (ct(fp8w), None, "weight-only FP8"),
        (ct(dict(fp8w, strategy="group"), fp8a), None, "strategy 'group'"),
        (ct(fp8w, fp8a), "fp8", None),
        ({"quantization_config": {"quant_method": "awq", "bits": 4}}, None, "'awq' is not supported"),
        ({"quantization_config": {"quant_method": "fp8", "fmt": "e5m2"}}, None, "'e5m2'"),
        ({"quantization_config": {"quant_method": "fp8"}}, "compressed-tensors", "does not match"),
        ({}, "compressed-tensors", "no quantization_config"),
        ({}, "int8", "not supported"),
    ]
    for hf, option, message in cases:
        if message is None:
            assert quant_config(hf, option).source == "compressed-tensors"
            continue
        with pytest.raises(QuantizationError, match=message):
            quant_config(hf, option)
    assert quant_config({}, None) is None
    assert quant_config({}, "fp8").source == "online"


def test_a_refused_scheme_fails_before_any_weight_is_read(tiny_root, tmp_path):
    src = make_tiny_model_dir(tiny_root, "llama")
    bad = tmp_path / "w4"
    shutil.copytree(src, bad)
    config = json.loads((bad / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "gptq", "bits": 4}
    (bad / "config.json").write_text(json.dumps(config))
    (bad / "model.safetensors").write_bytes(b"not read")
    with pytest.raises(QuantizationError, match="'gptq' is not supported"):
        load_model(str(bad), torch.float32, "cpu")


def test_engine_generates_with_fp8_weights(tiny_root, tmp_path):
    from aioinfer import LLM, SamplingParams

    src = make_tiny_model_dir(tiny_root, "qwen2")
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    prompts = [[5, 9, 200, 7], [33, 100, 3]]
    for kwargs in ({"model": str(src), "quantization": "fp8"},
                   {"model": str(write_fp8_checkpoint(src, tmp_path / "ct", "ct-channel"))}):
        llm = LLM(**kwargs, dtype="float32", device="cpu", num_kv_blocks=64)
        try:
            outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
            assert [len(o.outputs[0].token_ids) for o in outputs] == [8, 8]
        finally:
            llm.shutdown()
