"""The fused masked greedy kernel (structured_output/masked_greedy.py) against the three steps it replaces
(apply the bitmask, ``float()``, ``argmax``): token-identical, ties included.

On a machine without CUDA but with triton, the Triton interpreter runs it on CPU tensors
(TRITON_INTERPRET=1, set before the kernel is defined); CI installs no triton, so it skips there,
and the GPU run (marked ``gpu``) checks the compiled kernel, in an engine too."""

from __future__ import annotations

import os

import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernel is defined
pytest.importorskip("triton")

from aioinfer.structured_output.masked_greedy import BLOCK, masked_greedy, masked_greedy_reference  # noqa: E402

DEVICE = "cuda" if CUDA else "cpu"


def _bits(allowed: torch.Tensor) -> torch.Tensor:
    """[N, V] bool -> [N, ceil(V / 32)] int32 in llguidance's layout."""
    rows, vocab = allowed.shape
    words = (vocab + 31) // 32
    padded = torch.zeros(rows, words * 32, dtype=torch.int64)
    padded[:, :vocab] = allowed.long()
    weights = (1 << torch.arange(32, dtype=torch.int64))
    packed = (padded.view(rows, words, 32) * weights).sum(-1)
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("vocab", [1000, 2 * BLOCK + 77])
def test_matches_apply_float_argmax(dtype, vocab):
    generator = torch.Generator().manual_seed(vocab)
    rows = 6
    logits = torch.randn(rows, vocab, generator=generator).to(dtype)
    allowed = torch.rand(rows, vocab, generator=generator) < 0.3
    allowed[1] = False
    allowed[1, vocab - 1] = True  # one allowed token, the last
    allowed[2] = False  # none: argmax of all -inf is token 0, as torch's
    # Ties: row 3's maximum appears in the first block and again in the last (the first wins),
    # row 4's is a disallowed token larger than every allowed one.
    logits[3, 5], logits[3, vocab - 3] = 50.0, 50.0
    allowed[3, 5], allowed[3, vocab - 3] = True, True
    logits[4, 7] = 99.0
    allowed[4, 7] = False
    logits, bits = logits.to(DEVICE), _bits(allowed).to(DEVICE)
    got = masked_greedy(logits, bits)
    assert got.dtype == torch.int64
    assert got.tolist() == masked_greedy_reference(logits.cpu(), bits.cpu()).tolist()
    assert got[3].item() == 5 and got[4].item() != 7
    assert got[1].item() == vocab - 1 and got[2].item() == 0


def test_a_row_view_with_padding_stride():
    """Logits rows longer than the vocabulary (a padded LM head's output sliced): the stride is honoured."""
    generator = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 640, generator=generator).to(DEVICE)[:, :600]
    allowed = torch.rand(3, 600, generator=generator) < 0.5
    bits = _bits(allowed).to(DEVICE)
    assert masked_greedy(logits, bits).tolist() == masked_greedy_reference(logits.cpu(), bits.cpu()).tolist()


@pytest.mark.gpu
@pytest.mark.parametrize("speculative_config", [None, {"method": "ngram", "num_speculative_tokens": 3,
                                                       "prompt_lookup_max": 3, "prompt_lookup_min": 1}])
def test_engine_tokens_equal_with_the_fused_path(tmp_path_factory, monkeypatch, speculative_config):
    """In the engine (CUDA graphs, async scheduling: steps ahead sampled after their masks), every
    request constrained and greedy: the same tokens with the fused path as with the three launches,
    and the fused path is the one taken. With n-gram speculation on as well (where it proposes drafts,
    their verification rows are masked after each draft, a rejected draft's rows left all allowed). A tiny random Qwen2 (no weights to
    fetch on the GPU machine)."""
    from aioinfer import LLM, SamplingParams
    from aioinfer.structured_output import StructuredOutputsParams
    from aioinfer.worker import model_runner
    from aioinfer.structured_output.masked_greedy import MaskedGreedy
    from tiny_models import make_tiny_model_dir

    folder = make_tiny_model_dir(tmp_path_factory.mktemp("tiny"), "qwen2")
    # No prefix cache: the second run computes every prompt as the first did.
    llm = LLM(model=str(folder), device=DEVICE, dtype="bfloat16", gpu_memory_utilization=0.3, max_model_len=512,
              enable_prefix_caching=False, speculative_config=speculative_config)
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "tags": {"type": "array", "items": {
        "enum": ["a", "bb", "ccc"]}}}, "required": ["name", "tags"]}
    constraints = [StructuredOutputsParams(json=schema), StructuredOutputsParams(regex=r"[a-z ]{3,60}\."),
                   StructuredOutputsParams(choice=["yes", "no", "maybe not"])]
    prompts = [[3 + i, 50 + 7 * i, 90, 100 + i] for i in range(12)]
    params = [SamplingParams(temperature=0, max_tokens=48, structured_outputs=constraints[i % 3]) for i in range(12)]
    monkeypatch.setattr(MaskedGreedy, "enabled", False)  # the apply, the float copy and the argmax
    plain = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    calls = []
    fused = model_runner.masked_greedy
    monkeypatch.setattr(model_runner, "masked_greedy", lambda *args: calls.append(1) or fused(*args))
    monkeypatch.setattr(MaskedGreedy, "enabled", True)
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)] == plain
    assert len(calls) >= 20
