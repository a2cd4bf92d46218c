"""The engine on CUDA (marked gpu: skipped without a GPU).

- float32 tiny models: greedy tokens identical to transformers, eager and with CUDA graphs;
- bf16 Qwen2.5-0.5B shapes: logits within a stated tolerance of transformers' over a prefill plus
  32 teacher-forced decode steps, through the Triton paged kernels;
- CUDA-graph and eager runs give identical tokens in float32, and bf16 logprobs within a stated
  tolerance of each other on the same sequence.
"""

from __future__ import annotations

import random

import pytest
import torch

from aioinfer import LLM, SamplingParams
from tiny_models import make_tiny_model_dir

pytestmark = pytest.mark.gpu

# bf16 tolerance, per position, as ||logits - reference|| / ||reference|| over the vocabulary, the
# reference being transformers in float32 on the same (bf16-valued) weights:
# - ours in bf16 must stay under BF16_REL_TOL (measured on the H200: max 1.9e-2 against transformers' bf16);
# - and must be no worse than 1.5x transformers' own bf16 run against the same reference, so that a
#   real bug (wrong mask, wrong position, stale KV) cannot hide inside bf16 noise.
BF16_REL_TOL = 3e-2
BF16_VS_HF_BF16 = 1.5


def _prompts(vocab: int, n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.choice([1, 5, 15, 16, 17, 40, 100, 300]))] for _ in range(n)]


def _hf_greedy(path, prompts, max_new, dtype=torch.float32):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).cuda().eval()
    out = []
    with torch.no_grad():
        for p in prompts:
            ids = torch.tensor([p], device="cuda")
            gen = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new, do_sample=False)
            out.append(gen[0, len(p):].tolist())
    return out


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("enforce_eager", [True, False])
def test_float32_tiny_model_matches_transformers(tmp_path, arch, enforce_eager):
    path = make_tiny_model_dir(tmp_path, arch=arch)
    prompts = _prompts(400, 12)
    expected = _hf_greedy(path, prompts, 16)
    llm = LLM(model=str(path), dtype="float32", device="cuda", attention_backend="triton",
              enforce_eager=enforce_eager, max_num_batched_tokens=128, block_size=16, num_kv_blocks=256)
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, SamplingParams(temperature=0, max_tokens=16),
                                                        use_tqdm=False)]
    assert got == expected
    assert (llm.engine.executor.runner.graphs is None) == enforce_eager


def _qwen25_05b_config():
    from transformers import Qwen2Config

    return Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                       num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=4096,
                       rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
                       bos_token_id=151643, eos_token_id=151643)


@pytest.fixture(scope="module")
def qwen_05b_dir(tmp_path_factory):
    """Qwen2.5-0.5B shapes with transformers' random init, saved in bf16 as a real HF folder."""
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Qwen2ForCausalLM(_qwen25_05b_config()).to(torch.bfloat16)
    path = tmp_path_factory.mktemp("qwen25-05b")
    model.save_pretrained(path)
    del model
    torch.cuda.empty_cache()
    return path


def test_bf16_logits_track_transformers_over_prefill_and_decode(qwen_05b_dir):
    from transformers import AutoModelForCausalLM

    from aioinfer.attention.registry import get_attention_backend
    from aioinfer.attention.context import forward_context
    from aioinfer.models.loader import load_model
    from attn_helpers import allocate_kv_cache, make_metadata, shuffled_blocks

    device = torch.device("cuda")
    model, _ = load_model(str(qwen_05b_dir), dtype=torch.bfloat16, device=device,
                          attention_backend=get_attention_backend("triton", device))
    block_size = 16
    allocate_kv_cache(model, num_blocks=64, block_size=block_size, dtype=torch.bfloat16, device=device)
    rng = random.Random(1)
    prompt_len, steps = 77, 32
    tokens = [rng.randrange(151936) for _ in range(prompt_len + steps)]
    blocks = shuffled_blocks(-(-(prompt_len + steps) // block_size), seed=3)

    ours = []
    with torch.no_grad():
        ids = torch.tensor(tokens[:prompt_len], device=device)
        with forward_context(make_metadata([(0, prompt_len, blocks)], block_size, device)):
            hidden = model(ids, torch.arange(prompt_len, device=device))
        ours.append(model.compute_logits(hidden[-1:]))
        for t in range(prompt_len, prompt_len + steps):  # 32 teacher-forced decode steps
            with forward_context(make_metadata([(t, 1, blocks)], block_size, device)):
                hidden = model(torch.tensor([tokens[t]], device=device), torch.tensor([t], device=device))
            ours.append(model.compute_logits(hidden))
        ours = torch.cat(ours).float()

        window = slice(prompt_len - 1, prompt_len + steps)  # the prefill's last row + each decode step
        full = torch.tensor([tokens], device=device)
        hf32 = AutoModelForCausalLM.from_pretrained(qwen_05b_dir, dtype=torch.float32).cuda().eval()
        ref = hf32(full).logits[0, window].float()
        del hf32
        hf16 = AutoModelForCausalLM.from_pretrained(qwen_05b_dir, dtype=torch.bfloat16).cuda().eval()
        hf_bf16 = hf16(full).logits[0, window].float()

    def rel(x):
        return (x - ref).norm(dim=-1) / ref.norm(dim=-1)

    ours_err, hf_err = rel(ours), rel(hf_bf16)
    print(f"relative logit error vs transformers fp32 over {steps + 1} positions: aioinfer bf16 max "
          f"{ours_err.max().item():.3e} mean {ours_err.mean().item():.3e}; transformers bf16 max "
          f"{hf_err.max().item():.3e} mean {hf_err.mean().item():.3e}")
    assert ours_err.max().item() < BF16_REL_TOL
    assert ours_err.mean().item() <= BF16_VS_HF_BF16 * hf_err.mean().item()


def test_cuda_graphs_and_eager_give_identical_tokens(qwen_05b_dir):
    prompts = _prompts(151936, 24, seed=5)
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    runs = {}
    for eager in (True, False):
        llm = LLM(model=str(qwen_05b_dir), dtype="bfloat16", device="cuda", attention_backend="triton",
                  enforce_eager=eager, max_num_seqs=32, max_num_batched_tokens=2048, num_kv_blocks=2048)
        assert (llm.engine.executor.runner.graphs is None) == eager
        runs[eager] = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        del llm
        torch.cuda.empty_cache()
    assert runs[True] == runs[False]


# bf16, teacher-forced: most a logprob of the same sequence may differ between the graph and eager runs
# (padded graph shapes make cuBLAS choose other kernels: other rounding). Measured on an H100: 0.031.
BF16_GRAPH_TF_TOL = 0.1


def test_token_graphs_serve_prefix_hits_and_mixed_steps_like_eager(qwen_05b_dir):
    """Prefill and mixed steps of <= 256 tokens replay token-bucket graphs: short prompts next to
    decode rows, and prompts whose long shared prefix is cached (a 1100-token context behind a
    short tail: the prefill kernel splits the context); the hits are real.

    In float32 the tokens equal the eager run's (on an H100 the logprobs were bit-identical). In
    bf16 they need not: a padded graph batch rounds differently from the eager one, and with random
    weights greedy near-ties are common (where the two runs first parted, eager's top two were
    0.016 apart), so bf16 is compared teacher-forced: one sequence's logprobs, position by position
    (every step of it replaying a graph), within ``BF16_GRAPH_TF_TOL`` of eager's."""
    rng = random.Random(7)
    prefix = [rng.randrange(151936) for _ in range(1100)]
    cold = [prefix + [rng.randrange(151936) for _ in range(9)]]
    warm = [prefix + [rng.randrange(151936) for _ in range(n)] for n in (1, 16, 17, 40, 100)]
    short = _prompts(151936, 12, seed=9)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    for dtype in ("float32", "bfloat16"):
        runs, forced = {}, {}
        for eager in (True, False):
            llm = LLM(model=str(qwen_05b_dir), dtype=dtype, device="cuda", attention_backend="triton",
                      enforce_eager=eager, max_num_seqs=32, max_num_batched_tokens=256, num_kv_blocks=2048,
                      enable_prefix_caching=True)
            outs = llm.generate(cold, params, use_tqdm=False)  # caches the prefix
            outs += llm.generate(warm + short, params, use_tqdm=False)
            assert [o.num_cached_tokens for o in outs[1:len(warm) + 1]] == [1088] * len(warm)  # 68 full blocks
            runs[eager] = [o.outputs[0].token_ids for o in outs]
            sequence = cold[0] + runs[True][0]  # eager's, for both runs
            scored = llm.generate([sequence], SamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False)[0]
            forced[eager] = [entry[token].logprob for entry, token in zip(scored.prompt_logprobs[1:], sequence[1:])]
            if not eager:
                replays = llm.engine.executor.runner.graphs.num_replays
                assert replays["tokens"] > 0 and replays["decode"] > 0, replays
            del llm
            torch.cuda.empty_cache()
        if dtype == "float32":
            assert runs[True] == runs[False]
        worst = max(abs(a - b) for a, b in zip(forced[True], forced[False]))
        assert worst < (1e-4 if dtype == "float32" else BF16_GRAPH_TF_TOL), (dtype, worst)
