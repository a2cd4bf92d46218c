"""Sampler tests against a plain NumPy reference.

Seeds are fixed, so every statistical test is deterministic; the significance level (1e-4) only
says how surprising a correct sampler's result would have to be for the test to be wrong.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from aioinfer.sampling_params import SamplingParams
from aioinfer.sample.sampler import Sampler, greedy_sample, process_logits, sampling_probs
from aioinfer.sample.sampling_metadata import SamplingMetadata, SamplingRow, mix_seed

scipy_stats = pytest.importorskip("scipy.stats")

ALPHA = 1e-4
V = 12
# Distinct values (no ties), spread so every knob below changes the distribution.
RAW = np.array([2.0, 1.55, 1.2, 0.95, 0.5, 0.31, 0.02, -0.2, -0.55, -1.0, -1.45, -3.0], np.float32)
PROMPT = [1, 3, 5, 5]
OUTPUT = [1, 1, 2, 7]
EOS = (0,)

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=[pytest.mark.gpu,
                                pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]),
]


# ----------------------------------------------------------------------------- NumPy reference

def ref_processed_logits(raw: np.ndarray, row: SamplingRow) -> np.ndarray:
    """logit_bias, min_tokens, penalties, one token at a time, in float32 like the sampler."""
    p = row.params
    x = raw.astype(np.float32).copy()
    for token, bias in (p.logit_bias or {}).items():
        x[token] = np.float32(x[token] + np.float32(bias))
    if len(row.output_token_ids) < p.min_tokens:
        stops = list(p.stop_token_ids) + ([] if p.ignore_eos else list(row.eos_token_ids))
        for token in stops:
            x[token] = -np.inf
    counts = np.zeros(len(x), np.float32)
    for token in row.output_token_ids:
        counts[token] += 1
    seen = set(row.prompt_token_ids) | set(row.output_token_ids)
    rep = np.float32(p.repetition_penalty)
    for token in range(len(x)):
        if token in seen:
            x[token] = x[token] / rep if x[token] > 0 else x[token] * rep
    for token in range(len(x)):
        x[token] = x[token] - np.float32(p.frequency_penalty) * counts[token]
        x[token] = x[token] - np.float32(p.presence_penalty) * np.float32(counts[token] > 0)
    return x


def ref_probs(processed: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The distribution a random row draws from, in float64 with explicit loops."""
    if params.temperature == 0.0:
        out = np.zeros(len(processed))
        out[int(np.argmax(processed))] = 1.0
        return out
    z = processed.astype(np.float64) / params.temperature
    keep = np.isfinite(z)
    if params.top_k > 0:
        kth = np.sort(z)[::-1][min(params.top_k, len(z)) - 1]
        keep &= z >= kth
    p = np.where(keep, np.exp(z - z[keep].max()), 0.0)
    p /= p.sum()
    if params.top_p < 1.0:
        order = sorted(range(len(p)), key=lambda t: (-p[t], t))
        mass, dropped = 0.0, []
        for token in order:  # keep the smallest most-likely prefix whose mass reaches top_p
            if mass >= params.top_p:
                dropped.append(token)
            mass += p[token]
        p[dropped] = 0.0
        p /= p.sum()
    if params.min_p > 0.0:
        p = np.where(p >= params.min_p * p.max(), p, 0.0)
        p /= p.sum()
    return p


# ----------------------------------------------------------------------------- helpers

def make_row(seed: int = 0, output=None, prompt=None, **kw) -> SamplingRow:
    return SamplingRow(SamplingParams(**kw), list(PROMPT if prompt is None else prompt),
                       list(OUTPUT if output is None else output), seed, EOS)


def run(rows, logits, device="cpu", sampler=None):
    logits = torch.as_tensor(np.asarray(logits, np.float32)).to(device)
    if logits.dim() == 1:
        logits = logits.expand(len(rows), -1).contiguous()
    md = SamplingMetadata.build(rows, logits.shape[1], device)
    return (sampler or Sampler())(logits, md), md, logits


def assert_matches(counts: np.ndarray, probs: np.ndarray) -> None:
    """Exact zeros where the reference says 0, then a chi-square test on the rest."""
    n = counts.sum()
    assert counts[probs == 0].sum() == 0, (counts, probs)
    expected = n * probs[probs > 0]
    observed = counts[probs > 0].astype(np.float64)
    small = expected < 5  # pool sparse bins so the chi-square approximation holds
    if small.any():
        expected = np.append(expected[~small], expected[small].sum())
        observed = np.append(observed[~small], observed[small].sum())
    if len(expected) > 1:
        pvalue = scipy_stats.chisquare(observed, expected).pvalue
        assert pvalue > ALPHA, (pvalue, counts, np.round(n * probs, 1))


CONFIGS = {
    "plain": dict(),
    "cold": dict(temperature=0.5),
    "hot": dict(temperature=2.0),
    "top_k": dict(top_k=4),
    "top_p": dict(top_p=0.8),
    "min_p": dict(min_p=0.1),
    "repetition": dict(repetition_penalty=1.3),
    "frequency": dict(frequency_penalty=0.4),
    "presence": dict(presence_penalty=0.6),
    "negative_penalties": dict(repetition_penalty=0.7, frequency_penalty=-0.5, presence_penalty=-0.3),
    "logit_bias": dict(logit_bias={5: 2.0, 0: -3.0}),
    "min_tokens": dict(min_tokens=5, stop_token_ids=[3]),
    "top_k_top_p": dict(top_k=6, top_p=0.7, temperature=0.9),
    "top_p_then_min_p": dict(top_p=0.75, min_p=0.3),  # min-p first would keep one token fewer
    "everything": dict(temperature=0.8, top_k=8, top_p=0.9, min_p=0.05, repetition_penalty=1.2,
                       frequency_penalty=0.3, presence_penalty=0.2, logit_bias={7: 1.5, 2: -0.5},
                       min_tokens=6, stop_token_ids=[4]),
}


# ----------------------------------------------------------------------------- distribution

@pytest.mark.parametrize("name", list(CONFIGS))
def test_probs_match_reference(name):
    rows = [make_row(**CONFIGS[name])]
    md = SamplingMetadata.build(rows, V, "cpu")
    processed = process_logits(torch.from_numpy(RAW).unsqueeze(0), md)
    expected_logits = ref_processed_logits(RAW, rows[0])
    assert torch.equal(processed[0], torch.from_numpy(expected_logits))
    probs = sampling_probs(processed, md)[0].double().numpy()
    expected = ref_probs(expected_logits, rows[0].params)
    if rows[0].params.top_p < 1.0:  # the test is only meaningful away from a float boundary
        sorted_p = np.sort(ref_probs(expected_logits, SamplingParams(
            temperature=rows[0].params.temperature, top_k=rows[0].params.top_k)))[::-1]
        assert np.abs(np.cumsum(sorted_p) - rows[0].params.top_p).min() > 1e-3
    np.testing.assert_allclose(probs, expected, rtol=1e-5, atol=1e-7)
    assert (probs == 0).tolist() == (expected == 0).tolist()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(CONFIGS))
def test_empirical_distribution_across_seeds(name, device):
    n = 6000
    rows = [make_row(seed=1000 + i, **CONFIGS[name]) for i in range(n)]
    out, _, _ = run(rows, RAW, device)
    counts = np.bincount(out.sampled_token_ids.cpu().numpy(), minlength=V)
    probs = ref_probs(ref_processed_logits(RAW, rows[0]), rows[0].params)
    assert_matches(counts, probs)


def test_empirical_distribution_across_steps_one_seed():
    # One request over many steps: each step's noise must be fresh, not reused.
    n = 4000
    params = dict(temperature=1.3, top_k=9, min_p=0.02)
    rows = [make_row(seed=77, output=[11] * step, prompt=[], **params) for step in range(n)]
    out, _, _ = run(rows, RAW)
    counts = np.bincount(out.sampled_token_ids.numpy(), minlength=V)
    assert_matches(counts, ref_probs(RAW, SamplingParams(**params)))


def test_top_p_keeps_top_token_even_when_it_alone_exceeds():
    raw = np.array([5.0, 0.0, -1.0, -2.0], np.float32)
    rows = [make_row(seed=i, prompt=[], output=[], top_p=0.01) for i in range(200)]
    out, _, _ = run(rows, raw)
    assert out.sampled_token_ids.tolist() == [0] * 200


# ----------------------------------------------------------------------------- greedy

def test_greedy_ties_go_to_lowest_id():
    raw = np.array([0.0, 3.0, 1.0, 3.0, 3.0, -1.0], np.float32)
    out, _, _ = run([make_row(temperature=0, prompt=[], output=[])], raw)
    assert out.sampled_token_ids.tolist() == [1]
    assert greedy_sample(torch.zeros(2, 7)).tolist() == [0, 0]


@pytest.mark.parametrize("name", list(CONFIGS))
def test_greedy_is_argmax_after_processing(name):
    knobs = {k: v for k, v in CONFIGS[name].items() if k not in ("temperature", "top_k", "top_p", "min_p")}
    rng = np.random.default_rng(3)
    raws = rng.normal(size=(8, V)).astype(np.float32)
    rows = [make_row(seed=i, temperature=0, **knobs) for i in range(8)]
    out, _, _ = run(rows, raws)
    expected = [int(np.argmax(ref_processed_logits(raws[i], rows[i]))) for i in range(8)]
    assert out.sampled_token_ids.tolist() == expected


def test_argmax_of_raw_logits_gives_the_same_tokens(monkeypatch):
    """``Sampler.argmax_raw_logits`` (on by default): plain greedy steps take the argmax of the bf16
    logits themselves, the same tokens as the float copy's, ties to the lowest id; a step with a
    penalty, logit_bias or logprobs still goes the float way."""
    rng = np.random.default_rng(5)
    logits = torch.from_numpy(rng.normal(size=(6, V)).astype(np.float32)).to(torch.bfloat16)
    logits[2, 3] = logits[2, 9] = logits[2].max() + 1  # a tie
    plain = [make_row(seed=i, temperature=0) for i in range(6)]
    others = [[make_row(seed=i, temperature=0, repetition_penalty=1.5) for i in range(6)],
              [make_row(seed=i, temperature=0, logit_bias={3: 5.0}) for i in range(6)],
              [make_row(seed=i, temperature=0, logprobs=2) for i in range(6)]]
    monkeypatch.setattr(Sampler, "argmax_raw_logits", False)  # every step through the float copy
    expected = [Sampler()(logits, SamplingMetadata.build(rows, V, "cpu")).sampled_token_ids.tolist()
                for rows in [plain] + others]
    calls = []
    monkeypatch.setattr(Sampler, "argmax_raw_logits", True)
    monkeypatch.setattr(torch.Tensor, "float", lambda self, _float=torch.Tensor.float: calls.append(1) or _float(self))
    got = [Sampler()(logits, SamplingMetadata.build(rows, V, "cpu")).sampled_token_ids.tolist()
           for rows in [plain] + others]
    assert got == expected and expected[0][2] == 3
    assert len(calls) == len(others)  # the plain step made no float copy


def test_penalties_change_greedy_choice():
    raw = np.array([2.0, 1.9, 0.0, -1.0], np.float32)
    row = make_row(temperature=0, prompt=[0], output=[], repetition_penalty=1.2)
    assert run([row], raw)[0].sampled_token_ids.tolist() == [1]  # 2.0 / 1.2 < 1.9
    row = make_row(temperature=0, prompt=[], output=[0], presence_penalty=0.2)
    assert run([row], raw)[0].sampled_token_ids.tolist() == [1]
    row = make_row(temperature=0, prompt=[], output=[0], presence_penalty=0.05)
    assert run([row], raw)[0].sampled_token_ids.tolist() == [0]


def test_penalty_logits_exact_in_mixed_batch():
    # Rows with and without each penalty side by side: rows without must come out untouched.
    rng = np.random.default_rng(5)
    raws = (rng.normal(size=(6, V)) * 3).astype(np.float32)
    rows = [make_row(repetition_penalty=1.5, output=[0, 0, 4], prompt=[2, 9]),
            make_row(),
            make_row(frequency_penalty=1.7, output=[3, 3, 3, 11]),
            make_row(presence_penalty=-1.1, repetition_penalty=0.6),
            make_row(temperature=0, frequency_penalty=0.25, presence_penalty=2.0, output=[]),
            make_row(logit_bias={0: 100.0, 11: -100.0}, repetition_penalty=2.0)]
    md = SamplingMetadata.build(rows, V, "cpu")
    processed = process_logits(torch.from_numpy(raws), md)
    expected = np.stack([ref_processed_logits(raws[i], rows[i]) for i in range(6)])
    assert torch.equal(processed, torch.from_numpy(expected))
    assert torch.equal(processed[1], torch.from_numpy(raws[1]))


# ----------------------------------------------------------------------------- reproducibility

def _other_rows(rng):
    return [make_row(temperature=0),
            make_row(seed=int(rng.integers(1 << 40)), temperature=1.7, top_p=0.5),
            make_row(seed=int(rng.integers(1 << 40)), top_k=2, repetition_penalty=1.5),
            make_row(seed=int(rng.integers(1 << 40)), min_p=0.3, logprobs=4),
            make_row(temperature=0, logit_bias={3: 4.0})]


@pytest.mark.parametrize("device", DEVICES)
def test_batch_independence_any_position(device):
    rng = np.random.default_rng(11)
    params = dict(temperature=1.1, top_k=10, top_p=0.95, frequency_penalty=0.2)
    steps = range(0, 40)
    targets = [make_row(seed=123456789, output=[5] * s, **params) for s in steps]
    alone = [run([t], RAW, device)[0].sampled_token_ids.item() for t in targets]
    assert len(set(alone)) > 2  # noise varies with the step
    for position in range(6):
        got = []
        for target in targets:
            others = _other_rows(rng)
            rows = others[:position] + [target] + others[position:]
            logits = rng.normal(size=(len(rows), V)).astype(np.float32)
            logits[position] = RAW
            got.append(run(rows, logits, device)[0].sampled_token_ids[position].item())
        assert got == alone, position


def test_same_seed_same_tokens_and_seeds_differ():
    rows = [make_row(seed=s) for s in range(64)]
    a = run(rows, RAW)[0].sampled_token_ids
    b = run(rows, RAW)[0].sampled_token_ids
    sampler = Sampler()
    c = run(rows, RAW, sampler=sampler)[0].sampled_token_ids
    d = run(rows, RAW, sampler=sampler)[0].sampled_token_ids
    assert torch.equal(a, b) and torch.equal(a, c) and torch.equal(a, d)
    assert len(set(a.tolist())) > 3
    for seed in (-1, -(1 << 63), (1 << 64) - 1, 1 << 70):  # any Python int is a valid seed
        assert run([make_row(seed=seed)], RAW)[0].sampled_token_ids.shape == (1,)
    assert mix_seed(-1, 0) == mix_seed((1 << 64) - 1, 0) and mix_seed(1, 0) != mix_seed(1, 1)


def test_recompute_after_preemption_continues_identically():
    rng = np.random.default_rng(2)
    table = rng.normal(size=(V, V)).astype(np.float32) * 2  # next-token logits given the last token
    params = dict(temperature=0.9, top_p=0.9, repetition_penalty=1.1, presence_penalty=0.3)

    def generate(prefix, steps, sampler):
        out = list(prefix)
        for _ in range(steps):
            row = make_row(seed=42, prompt=[4], output=out, **params)
            noise_row = make_row(seed=int(rng.integers(1 << 30)), temperature=1.5)
            rows = [noise_row, row] if len(out) % 2 else [row, noise_row]
            logits = np.stack([table[(out or [4])[-1]]] * 2)
            res = run(rows, logits, sampler=sampler)[0].sampled_token_ids
            out.append(res[rows.index(row)].item())
        return out

    full = generate([], 30, Sampler())
    assert generate(full[:12], 18, Sampler()) == full


# ----------------------------------------------------------------------------- logprobs

def test_logprobs_are_raw_and_ranked():
    rng = np.random.default_rng(9)
    raws = rng.normal(size=(5, 16)).astype(np.float32) * 2
    rows = [make_row(seed=1, logprobs=3, temperature=0.5, repetition_penalty=1.4, logit_bias={2: 5.0}),
            make_row(temperature=0, logprobs=5, presence_penalty=1.0),
            make_row(seed=2),
            make_row(seed=3, logprobs=0, top_k=3),
            make_row(seed=4, logprobs=1, min_tokens=9, stop_token_ids=[6])]
    out, _, logits = run(rows, raws)
    expected = torch.log_softmax(logits, dim=-1)
    sampled = out.sampled_token_ids
    assert torch.equal(out.sampled_logprobs, expected.gather(1, sampled.unsqueeze(1)).squeeze(1))
    for i in range(5):
        lp = expected[i]
        assert out.sampled_ranks[i].item() == 1 + int((lp > lp[sampled[i]]).sum())
    assert out.top_token_ids.shape == (5, 5) and out.top_logprobs.shape == (5, 5)
    assert out.top_token_ids.dtype == torch.int64 and out.sampled_ranks.dtype == torch.int64
    assert torch.equal(out.top_token_ids, expected.argsort(dim=-1, descending=True)[:, :5])
    assert torch.equal(out.top_logprobs, expected.gather(1, out.top_token_ids))
    assert (out.top_logprobs[:, :-1] >= out.top_logprobs[:, 1:]).all()
    # The greedy row's token is its processed argmax but its rank comes from the raw distribution.
    assert out.sampled_ranks[1].item() >= 1


def test_logprobs_absent_or_empty():
    out, _, _ = run([make_row(seed=1), make_row(temperature=0)], RAW)
    assert out.sampled_logprobs is None and out.top_token_ids is None and out.sampled_ranks is None
    out, _, _ = run([make_row(seed=1, logprobs=0)], RAW)
    assert out.top_token_ids.shape == (1, 0) and out.sampled_ranks.shape == (1,)


# ----------------------------------------------------------------------------- min_tokens

def test_min_tokens_masks_eos_and_stops_until_reached():
    raw = np.array([9.0, 1.0, 0.5, 8.0, 0.0, -1.0, 0.2, 0.1], np.float32)  # EOS 0 and stop 3 dominate
    for greedy in (True, False):
        for step in range(5):
            extra = dict(temperature=0) if greedy else dict(temperature=1.0)
            rows = [make_row(seed=s, prompt=[], output=[1] * step, min_tokens=3, stop_token_ids=[3],
                             **extra) for s in range(300)]
            out, md, logits = run(rows, raw)
            processed = process_logits(logits, md)
            tokens = set(out.sampled_token_ids.tolist())
            if step < 3:
                assert not tokens & {0, 3}
                assert torch.isinf(processed[:, [0, 3]]).all()
            else:
                assert md.min_tokens_index is None
                assert torch.equal(processed, logits)
                assert 0 in tokens


def test_min_tokens_with_ignore_eos_masks_only_stop_tokens():
    rows = [make_row(prompt=[], output=[], min_tokens=2, stop_token_ids=[3], ignore_eos=True)]
    md = SamplingMetadata.build(rows, V, "cpu")
    processed = process_logits(torch.from_numpy(RAW).unsqueeze(0), md)
    assert torch.isinf(processed[0, 3]) and processed[0, 0] == RAW[0]



@pytest.mark.parametrize("device", DEVICES)
def test_min_tokens_leaves_a_row_its_stops_when_nothing_else_is_allowed(device):
    """A grammar's mask (applied before the sampler) may allow only stop tokens, as EOS once the grammar
    is complete: min_tokens then leaves that row's stops as they are (the grammar wins; the scheduler
    does not end a request on a stop token before min_tokens), and masks them in the other rows."""
    rows = [make_row(seed=s, prompt=[], output=[], min_tokens=4, stop_token_ids=[3], temperature=t)
            for s, t in ((1, 0), (2, 1.0), (3, 0), (4, 1.0))]
    logits = torch.from_numpy(np.tile(RAW, (4, 1)))
    logits[0, [i for i in range(V) if i not in (0, 3)]] = float("-inf")  # only EOS and the stop token left
    logits[1, [i for i in range(V) if i != 0]] = float("-inf")  # only EOS
    logits[2, [i for i in range(V) if i not in (0, 5)]] = float("-inf")  # EOS and one token: that token
    logits = logits.to(device)
    md = SamplingMetadata.build(rows, V, device)
    processed = process_logits(logits, md)
    assert torch.equal(processed[0], logits[0]) and torch.equal(processed[1], logits[1])
    assert processed[2, 5] == logits[2, 5] and torch.isinf(processed[2, [0, 3]]).all()
    assert torch.isinf(processed[3, [0, 3]]).all() and torch.isfinite(processed[3, [1, 2, 4]]).all()
    tokens = Sampler()(logits, md).sampled_token_ids.tolist()
    assert tokens[0] in (0, 3) and tokens[1] == 0 and tokens[2] == 5 and tokens[3] not in (0, 3)

# ----------------------------------------------------------------------------- hygiene

def test_input_logits_not_modified():
    rows = [make_row(seed=1, logit_bias={1: 3.0}, min_tokens=10, repetition_penalty=1.5, top_k=3)]
    logits = torch.from_numpy(RAW.copy()).unsqueeze(0)
    Sampler()(logits, SamplingMetadata.build(rows, V, "cpu"))
    assert torch.equal(logits[0], torch.from_numpy(RAW))


def test_skips_work_no_row_needs(monkeypatch):
    import aioinfer.sample.sampler as sampler_mod

    rows = [make_row(temperature=0, prompt=[], output=[]), make_row(temperature=0)]
    md = SamplingMetadata.build(rows, V, "cpu")
    assert md.all_greedy and md.temperature is None and md.penalties is None
    assert md.top_k is None and md.top_p is None and md.min_p is None and md.noise_keys is None

    def boom(*args, **kwargs):
        raise AssertionError("all-greedy batch must not build a distribution")

    monkeypatch.setattr(sampler_mod, "sampling_probs", boom)
    assert Sampler()(torch.from_numpy(RAW).expand(2, V).contiguous(), md).sampled_token_ids.tolist() == [0, 0]

    md = SamplingMetadata.build([make_row(seed=1, top_k=V), make_row(seed=2, top_p=1.0)], V, "cpu")
    assert md.all_random and md.greedy_mask is None and md.top_k is None and md.top_p is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_no_host_sync_on_cuda():
    rows = [make_row(seed=i, **CONFIGS[name], logprobs=2) for i, name in enumerate(CONFIGS)]
    rows.append(make_row(temperature=0, repetition_penalty=1.3))
    logits = torch.from_numpy(RAW).expand(len(rows), V).contiguous().cuda()
    sampler = Sampler()
    sampler(logits, SamplingMetadata.build(rows, V, "cuda"))  # warm-up: generator, pinned pool
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        md = SamplingMetadata.build(rows, V, torch.device("cuda"))
        out = sampler(logits, md)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert out.sampled_token_ids.device.type == "cuda"


# ----------------------------------------------------------------------------- seeded noise

from aioinfer.sample import seeded_noise  # noqa: E402

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _keys(n, seed=0):
    rng = np.random.default_rng(seed)
    return torch.tensor([seeded_noise.noise_key(int(rng.integers(-(1 << 62), 1 << 62)), int(rng.integers(1 << 20)))
                         for _ in range(n)], dtype=torch.int64)


def test_noise_hash_matches_python_splitmix():
    keys = _keys(6)
    keys[0] = 0
    keys[1] = -1  # all bits set
    vocab = 5000
    bits = seeded_noise.hash_bits_torch(keys, vocab)
    rng = np.random.default_rng(1)
    mask = (1 << 64) - 1
    for r in range(len(keys)):
        key = int(keys[r]) & mask
        for v in [0, 1, vocab - 1, *rng.integers(vocab, size=40).tolist()]:
            # splitmix64 stream seeded by the key: element v is mix(key + (v + 1) * golden).
            expected = seeded_noise.splitmix64((key + v * seeded_noise._GOLDEN) & mask)
            assert int(bits[r, v]) == seeded_noise.to_int64(expected), (r, v)


def test_noise_is_exponential_and_batch_free():
    keys = _keys(40, seed=2)
    noise = seeded_noise.seeded_exponential_torch(keys, 5000)  # [40, 5000]
    assert noise.dtype == torch.float32 and (noise > 0).all() and torch.isfinite(noise).all()
    pvalue = scipy_stats.kstest(noise.flatten().double().numpy(), "expon").pvalue
    assert pvalue > ALPHA, pvalue
    # A row's noise depends on its key alone: not on the batch size, order or neighbours.
    perm = torch.randperm(len(keys), generator=torch.Generator().manual_seed(0))
    assert torch.equal(seeded_noise.seeded_exponential_torch(keys[perm], 5000), noise[perm])
    assert torch.equal(seeded_noise.seeded_exponential_torch(keys[7:8], 5000), noise[7:8])
    # Consecutive steps of one seed, and neighbouring seeds, give unrelated streams.
    steps = torch.tensor([seeded_noise.noise_key(5, s) for s in range(8)] +
                         [seeded_noise.noise_key(s, 0) for s in range(100, 108)], dtype=torch.int64)
    corr = np.corrcoef(seeded_noise.seeded_exponential_torch(steps, 20000).numpy())
    off_diagonal = corr[~np.eye(len(steps), dtype=bool)]
    assert np.abs(off_diagonal).max() < 0.04, np.abs(off_diagonal).max()
    assert seeded_noise.noise_key(-1, 0) == seeded_noise.noise_key((1 << 64) - 1, 0)


def test_vectorised_noise_keys_match_noise_key():
    """The batch's keys come from NumPy uint64 arithmetic (SamplingMetadata.build): bit for bit the same."""
    rng = np.random.default_rng(3)
    seeds = [0, 1, -1, (1 << 64) - 1, 1 << 63, -(1 << 63), 1 << 70, -(1 << 90) + 7]
    seeds += [int(s) for s in rng.integers(-(1 << 62), 1 << 62, size=500)]
    steps = [0, 1, 1 << 20, (1 << 64) - 1] + [int(s) for s in rng.integers(0, 1 << 40, size=len(seeds) - 4)]
    keys = seeded_noise.noise_keys(seeds, steps)
    assert keys.dtype == np.int64
    assert keys.tolist() == [seeded_noise.noise_key(a, b) for a, b in zip(seeds, steps)]


def test_triton_kernel_interpreted_matches_torch():
    # The CUDA kernel, run by Triton's interpreter on CPU tensors: same 64 bits, same noise.
    pytest.importorskip("triton")
    import subprocess
    import sys

    code = (
        "import torch\n"
        "from aioinfer.sample import seeded_noise as sn\n"
        "keys = torch.tensor([sn.noise_key(s, t) for s, t in [(0, 0), (1, 0), (-1, 5), (1 << 70, 3), (7, 999)]])\n"
        "for vocab, block in [(1, 16), (1000, 256), (3001, 1024)]:\n"
        "    bits = sn.seeded_exponential_triton(keys, vocab, block=block, raw_bits=True)\n"
        "    assert torch.equal(bits, sn.hash_bits_torch(keys, vocab)), vocab\n"
        "    noise = sn.seeded_exponential_triton(keys, vocab, block=block)\n"
        "    torch.testing.assert_close(noise, sn.seeded_exponential_torch(keys, vocab), rtol=1e-6, atol=1e-7)\n"
        "print('ok')\n"
    )
    import os

    env = dict(os.environ, TRITON_INTERPRET="1")
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-3000:]


@pytest.mark.gpu
@CUDA
def test_gpu_noise_bits_match_cpu():
    keys = _keys(64, seed=3)
    vocab = 151936  # Qwen2.5's vocabulary: several blocks per row, a ragged last block
    bits = seeded_noise.seeded_exponential_triton(keys.cuda(), vocab, raw_bits=True)
    assert torch.equal(bits.cpu(), seeded_noise.hash_bits_torch(keys, vocab))
    noise = seeded_noise.seeded_exponential(keys.cuda(), vocab)
    torch.testing.assert_close(noise.cpu(), seeded_noise.seeded_exponential_torch(keys, vocab), rtol=1e-6, atol=1e-7)


@pytest.mark.gpu
@CUDA
def test_gpu_tokens_match_cpu_sampler():
    # Same seeds on CPU and GPU: same noise, so the same token wherever the two devices' float
    # rounding of the probabilities does not flip a near-tie (rare); and the same distribution.
    n, vocab = 8000, 64
    rng = np.random.default_rng(4)
    raws = (rng.normal(size=(n, vocab)) * 2).astype(np.float32)
    params = dict(temperature=0.8, top_k=40, top_p=0.9, min_p=0.02, repetition_penalty=1.2,
                  frequency_penalty=0.3, presence_penalty=0.2)
    rows = [make_row(seed=i, **params) for i in range(n)]
    cpu = run(rows, raws, "cpu")[0].sampled_token_ids.numpy()
    gpu = run(rows, raws, "cuda")[0].sampled_token_ids.cpu().numpy()
    assert (cpu == gpu).mean() >= 0.999, (cpu == gpu).mean()
    # Two-sample chi-square on one fixed distribution, disjoint seeds per device.
    rows_a = [make_row(seed=i, **CONFIGS["everything"]) for i in range(6000)]
    rows_b = [make_row(seed=10**6 + i, **CONFIGS["everything"]) for i in range(6000)]
    counts_gpu = np.bincount(run(rows_a, RAW, "cuda")[0].sampled_token_ids.cpu().numpy(), minlength=V)
    counts_cpu = np.bincount(run(rows_b, RAW, "cpu")[0].sampled_token_ids.numpy(), minlength=V)
    used = (counts_gpu + counts_cpu) > 0
    pvalue = scipy_stats.chi2_contingency(np.stack([counts_gpu[used], counts_cpu[used]])).pvalue
    assert pvalue > ALPHA, (pvalue, counts_gpu, counts_cpu)


@pytest.mark.gpu
@CUDA
def test_gpu_seeds_reproduce_at_full_vocab():
    vocab = 151936
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(32, vocab, generator=gen) * 3
    rows = [make_row(seed=1000 + i, temperature=1.0, top_p=0.95) for i in range(32)]
    first = run(rows, logits, "cuda")[0].sampled_token_ids.cpu()
    again = run(rows, logits, "cuda", sampler=Sampler())[0].sampled_token_ids.cpu()
    perm = torch.randperm(32, generator=gen)
    shuffled = run([rows[i] for i in perm.tolist()], logits[perm], "cuda")[0].sampled_token_ids.cpu()
    assert torch.equal(first, again) and torch.equal(shuffled, first[perm])
    alone = run(rows[5:6], logits[5:6], "cuda")[0].sampled_token_ids.cpu()
    assert alone.item() == first[5].item()
    cpu = run(rows, logits, "cpu")[0].sampled_token_ids
    assert (cpu == first).float().mean() >= 0.9  # same noise; only float near-ties may differ
    assert len(set(first.tolist())) > 16
