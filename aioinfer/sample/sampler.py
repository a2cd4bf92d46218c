"""Turns one step's logits into tokens: processors, then greedy or seeded random sampling.

Order (vLLM's): raw logprobs -> logit_bias -> min_tokens -> repetition / frequency / presence
penalties -> greedy argmax, or temperature -> top-k -> top-p -> min-p -> sample.

Random rows sample with the exponential race: ``argmax(p / E)`` with ``E ~ Exp(1)`` iid picks
token ``i`` with probability ``p_i`` and needs no cumulative sum or host-side draw. All rows' ``E``
come from one vectorised counter-based draw (seeded_noise.py: a Triton kernel on CUDA, the same
hash in torch on CPU) keyed by (row seed, step) alone, so a seeded row gets the same token whatever
else is in the batch, a recomputed (preempted) request continues identically, and CPU and GPU draw
the same noise. No step of the sampler syncs with the host.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from aioinfer.sample.logprobs import compute_logprobs
from aioinfer.sample.penalties import apply_logit_bias, apply_min_tokens, apply_penalties
from aioinfer.sample.sampling_metadata import SamplingMetadata
from aioinfer.sample.seeded_noise import seeded_exponential


@dataclass(slots=True)
class SamplerOutput:
    """One step's tokens, and logprobs when any row asked (all on the logits' device)."""

    sampled_token_ids: torch.Tensor  # [N] int64
    sampled_logprobs: Optional[torch.Tensor] = None  # [N] float32, raw-model logprob of the sampled token
    sampled_ranks: Optional[torch.Tensor] = None  # [N] int64, 1 = most likely
    top_token_ids: Optional[torch.Tensor] = None  # [N, K] int64, most likely first; K = max requested
    top_logprobs: Optional[torch.Tensor] = None  # [N, K] float32; rows asking fewer use a prefix


def plain_greedy(metadata: SamplingMetadata) -> bool:
    """Whether sampling is the argmax of the raw logits: every row greedy, nothing that changes the
    logits (logit_bias, min_tokens, penalties), no logprobs to compute."""
    return (metadata.all_greedy and metadata.bias_index is None and metadata.min_tokens_index is None
            and metadata.penalties is None and metadata.max_num_logprobs is None)


class Sampler:
    """Stateless: ``Sampler()(logits, metadata) -> SamplerOutput``."""

    # Plain greedy steps take the argmax of the logits as they are (bf16 on the GPU) instead of a
    # float32 copy's: the same tokens (a bf16 value is exact in float32), one launch and a [N, V]
    # float32 write fewer (on the H200 at 256 x 151,936: 0.055 ms of device time and 17 µs of CPU
    # against 0.175 ms and 31 µs; 2026-12-05). Class-wide, so that
    # tests and benchmarks can compare it with the float copy's path.
    argmax_raw_logits = True

    def __call__(self, logits: torch.Tensor, metadata: SamplingMetadata) -> SamplerOutput:
        """Sample one token per row. ``logits``: [N, V] raw model logits; not modified."""
        # logits: [N, V]
        # Flat row * V + token indices in the metadata are only right for this exact shape.
        assert logits.shape == (metadata.num_rows, metadata.vocab_size), (logits.shape, metadata.vocab_size)
        if self.argmax_raw_logits and plain_greedy(metadata):
            return SamplerOutput(sampled_token_ids=greedy_sample(logits))
        raw = logits.float()
        processed = process_logits(raw, metadata)  # [N, V]
        if metadata.all_greedy:
            sampled = greedy_sample(processed)
        else:
            probs = sampling_probs(processed, metadata, renormalise=False)  # [N, V]
            sampled = self._random_sample(probs, metadata)
            if metadata.greedy_mask is not None:
                sampled = torch.where(metadata.greedy_mask, greedy_sample(processed), sampled)
        out = SamplerOutput(sampled_token_ids=sampled)
        if metadata.max_num_logprobs is not None:
            (out.sampled_logprobs, out.sampled_ranks, out.top_token_ids,
             out.top_logprobs) = compute_logprobs(raw, sampled, metadata.max_num_logprobs)
        return out

    @staticmethod
    def _random_sample(probs: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor:
        # probs: [N, V], unnormalised is fine: argmax(p / E) does not care about scale.
        # One draw for every row (greedy rows too: their key is 0 and their result is replaced).
        # E > 0 always (u < 1 strictly), so p / E is never nan.
        noise = seeded_exponential(metadata.noise_keys, probs.shape[1])  # [N, V] float32
        return probs.div_(noise).argmax(dim=-1)


def process_logits(raw_logits: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor:
    """logit_bias, min_tokens and penalties: the logits greedy rows take the argmax of.

    Returns a new [N, V] float32 tensor (``raw_logits`` itself when nothing applies).
    """
    logits = raw_logits
    if metadata.bias_index is not None or metadata.min_tokens_index is not None:
        logits = logits.clone(memory_format=torch.contiguous_format)  # in-place below; keep raw intact
        if metadata.bias_index is not None:
            apply_logit_bias(logits, metadata.bias_index, metadata.bias_value)
        if metadata.min_tokens_index is not None:
            apply_min_tokens(logits, metadata.min_tokens_index)
    if metadata.penalties is not None:
        logits = apply_penalties(logits, metadata.penalties)
    return logits


def greedy_sample(logits: torch.Tensor) -> torch.Tensor:
    """Argmax per row; ties go to the lowest token id (torch.argmax returns the first maximum)."""
    return logits.argmax(dim=-1)


def sampling_probs(logits: torch.Tensor, metadata: SamplingMetadata, renormalise: bool = True
                   ) -> torch.Tensor:
    """Temperature, top-k, top-p, then min-p over processed logits: the distribution random rows draw from.

    Returns a new [N, V] float32 tensor; with ``renormalise`` each row sums to 1, otherwise
    filtered-out tokens are 0 and the rest keep their pre-filter probabilities (enough for
    sampling, and it saves a pass). Greedy rows come out as plain softmax and are not used.
    """
    # logits: [N, V]
    if metadata.temperature is not None:
        logits = logits / metadata.temperature.unsqueeze(1)
    filtered = metadata.top_k is not None or metadata.top_p is not None
    if not filtered:
        probs = logits.softmax(dim=-1)
    else:
        # Stable descending sort: among equal logits the lower id comes first, so ties at the top-p
        # boundary are resolved the same way on every device and batch.
        sorted_logits, order = logits.sort(dim=-1, descending=True, stable=True)  # [N, V]
        if metadata.top_k is not None:
            # Threshold on the k-th largest logit: tokens tied with it stay (vLLM does the same).
            kth = sorted_logits.gather(1, (metadata.top_k - 1).unsqueeze(1))  # [N, 1]
            sorted_logits.masked_fill_(sorted_logits < kth, float("-inf"))
        sorted_probs = sorted_logits.softmax(dim=-1)  # [N, V], renormalised over the top-k
        if metadata.top_p is not None:
            # Keep a token while the mass strictly before it is still short of top_p: the smallest
            # prefix reaching top_p. The first token has 0 before it, so it always stays.
            mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
            sorted_probs.masked_fill_(mass_before >= metadata.top_p.unsqueeze(1), 0.0)
        probs = torch.empty_like(sorted_probs).scatter_(1, order, sorted_probs)
    if metadata.min_p is not None:
        # A ratio test against the top token, so it reads the same before or after renormalising.
        p_max = probs.amax(dim=-1, keepdim=True)  # [N, 1]
        probs.masked_fill_(probs < metadata.min_p.unsqueeze(1) * p_max, 0.0)
    if renormalise and (metadata.top_p is not None or metadata.min_p is not None):
        probs.div_(probs.sum(dim=-1, keepdim=True))
    return probs
