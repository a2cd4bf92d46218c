"""The static-buffer layouts that CUDA-graph replays write, checked on CPU tensors.

Capturing needs CUDA (tests/engine/test_gpu_engine.py replays real graphs against eager runs); what a
replay writes into the static buffers does not, and a wrong padding layout would let a graph
read past a block table or leave rows of the prefill kernel's grid without a sequence. Here the
graphs are stand-ins whose replay records the buffers, and the Torch reference attention runs
over the recorded layout: the real rows must come out as for the unpadded step.
"""

from __future__ import annotations

import random

import pytest
import torch

from aioinfer.attention.dense import dense_causal_attention
from aioinfer.worker.cuda_graphs import CudaGraphRunner, graph_buckets, token_buckets
from aioinfer.worker.input_buffers import StepInputs
from attn_helpers import make_metadata

BLOCK = 16


def test_bucket_sizes():
    assert token_buckets(256) == [16, 32, 64, 128, 256]
    assert token_buckets(100) == [16, 32, 64, 100]
    assert token_buckets(16) == [16] and token_buckets(8) == [8] and token_buckets(0) == []
    assert graph_buckets(20) == [1, 2, 4, 8, 16, 20]


class _RecordingGraph:
    """Stands in for a captured graph: replay snapshots what the graph would read."""

    def __init__(self, runner: CudaGraphRunner, num_tokens: int, num_seqs: int, tokens_kind: bool) -> None:
        self.runner, self.num_tokens, self.num_seqs, self.tokens_kind = runner, num_tokens, num_seqs, tokens_kind
        self.seen: dict[str, torch.Tensor] = {}

    def replay(self) -> None:
        buf = self.runner.inputs
        qsl = buf.token_query_start_loc if self.tokens_kind else buf.query_start_loc
        self.seen = {"input_ids": buf.input_ids[:self.num_tokens].clone(),
                     "positions": buf.positions[:self.num_tokens].clone(),
                     "slot_mapping": buf.slot_mapping[:self.num_tokens].clone(),
                     "seq_lens": buf.seq_lens[:self.num_seqs].clone(),
                     "query_start_loc": qsl[:self.num_seqs + 1].clone(),
                     "block_tables": buf.block_tables[:self.num_seqs].clone()}


def _runner(max_tokens: int, max_num_seqs: int, max_blocks: int) -> CudaGraphRunner:
    runner = CudaGraphRunner(model=None, max_batch_size=8, max_blocks_per_seq=max_blocks, max_model_len=max_blocks * BLOCK,
                             device=torch.device("cpu"), decode_splits=lambda _b: None,
                             max_prefill_tokens=max_tokens, max_num_seqs=max_num_seqs)
    hidden = 4
    for t in runner.token_buckets:  # what capture() would have stored: (graph, static output)
        runner._token_graphs[t] = (_RecordingGraph(runner, t, runner.token_seqs(t), True), torch.zeros(t, hidden))
    for b in runner.buckets:
        runner._graphs[b] = (_RecordingGraph(runner, b, b, False), torch.zeros(b, hidden))
    return runner


def _step(seqs, max_blocks: int) -> StepInputs:
    md = make_metadata(seqs, BLOCK)
    tables = torch.zeros(len(seqs), max_blocks, dtype=torch.int32)
    tables[:, :md.block_tables.shape[1]] = md.block_tables
    md.block_tables = tables
    positions = torch.tensor([p for c, n, _ in seqs for p in range(c, c + n)])
    return StepInputs(input_ids=torch.arange(100, 100 + md.num_tokens), positions=positions, attention=md,
                      logits_indices=md.query_start_loc[1:].long() - 1, sampled_request_ids=[],
                      is_decode_only=all(n == 1 for _, n, _ in seqs))


def _attend(seen, q, k_cache, v_cache, num_seqs):
    """Reference paged attention over a recorded layout, row by row (sequences' queries are their last tokens)."""
    out = torch.full_like(q, float("nan"))
    qsl = seen["query_start_loc"].tolist()
    for s in range(num_seqs):
        start, end, n = qsl[s], qsl[s + 1], int(seen["seq_lens"][s])
        if end == start:
            continue
        assert n >= end - start, "a sequence has more queries than context"
        blocks = seen["block_tables"][s, :-(-n // BLOCK)].long()
        k = k_cache[blocks].reshape(-1, *k_cache.shape[2:])[:n]
        v = v_cache[blocks].reshape(-1, *v_cache.shape[2:])[:n]
        out[start:end] = dense_causal_attention(q[start:end], k, v, 1.0)
    return out


@pytest.mark.parametrize("seqs_spec", [
    [(4096 - 32, 32)],  # a prefix-cache hit: a short tail over a long cached context
    [(40, 1), (0, 9), (17, 1), (100, 30)],  # decode rows beside prompt chunks
    [(0, 64)],  # exactly a bucket: no padding tokens
    [(5, 1)] * 7 + [(0, 2)],  # as many sequences as the bucket allows
], ids=["hit", "mixed", "full-bucket", "many-seqs"])
def test_token_graph_replay_pads_into_one_extra_sequence(seqs_spec):
    rng = random.Random(0)
    max_blocks = 4096 // BLOCK + 1
    num_blocks = 600
    ids = list(range(1, num_blocks))  # block 0: the null block
    rng.shuffle(ids)
    seqs, at = [], 0
    for computed, new in seqs_spec:
        need = -(-(computed + new) // BLOCK)
        seqs.append((computed, new, ids[at:at + need]))
        at += need
    runner = _runner(max_tokens=256, max_num_seqs=8, max_blocks=max_blocks)
    inputs = _step(seqs, max_blocks)
    t, s = inputs.attention.num_tokens, inputs.attention.num_seqs
    hidden, logits = runner.run(inputs)
    assert logits is None  # token graphs never compute logits
    bucket = runner.token_bucket_for(t)
    graph = runner._token_graphs[bucket][0]
    seen = graph.seen
    assert hidden.shape[0] == t and runner.num_replays["tokens"] == 1
    num_seqs = runner.token_seqs(bucket)

    # Real rows are the step's; padding tokens write nowhere; every token of the bucket has a sequence.
    assert torch.equal(seen["input_ids"][:t], inputs.input_ids)
    assert torch.equal(seen["slot_mapping"][:t], inputs.attention.slot_mapping)
    assert (seen["slot_mapping"][t:] == -1).all()
    qsl = seen["query_start_loc"]
    assert torch.equal(qsl[:s + 1], inputs.attention.query_start_loc)
    assert (qsl[s + 1:] == bucket).all() and int(qsl[-1]) == bucket
    assert int(seen["seq_lens"][s]) == bucket - t  # the padding sequence: context = its own tokens
    assert (seen["block_tables"][s] == 0).all()  # ... in the null block

    # The reference attention over the recorded, padded layout equals the unpadded step's on real rows.
    heads, dim = 2, 8
    k_cache, v_cache = torch.randn(num_blocks, BLOCK, heads, dim), torch.randn(num_blocks, BLOCK, heads, dim)
    q = torch.randn(bucket, heads, dim)
    padded = _attend(seen, q, k_cache, v_cache, num_seqs)
    plain_seen = {"query_start_loc": inputs.attention.query_start_loc, "seq_lens": inputs.attention.seq_lens,
                  "block_tables": inputs.attention.block_tables}
    plain = _attend(plain_seen, q[:t], k_cache, v_cache, s)
    torch.testing.assert_close(padded[:t], plain)
    assert not torch.isnan(padded).any(), "a row of the bucket belongs to no sequence"


def test_decode_replay_keeps_the_decode_layout_after_a_token_replay():
    runner = _runner(max_tokens=64, max_num_seqs=8, max_blocks=8)
    runner.run(_step([(3, 20, [1, 2]), (0, 5, [3])], 8))  # a token replay rewrites shared buffers
    decode = _step([(20, 1, [4, 5]), (7, 1, [6]), (30, 1, [7, 8])], 8)
    runner.run(decode)
    seen = runner._graphs[4][0].seen
    assert runner.num_replays == {"tokens": 1, "decode": 1}
    assert torch.equal(seen["query_start_loc"], torch.arange(5, dtype=torch.int32))
    assert seen["seq_lens"].tolist() == [21, 8, 31, 1]  # the padding row: one token of the null block
    assert seen["slot_mapping"][3] == -1 and seen["block_tables"][3, 0] == 0
