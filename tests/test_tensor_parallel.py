"""Tensor parallelism over gloo on the CPU: real worker processes, real checkpoints.

- the split layers (column / row parallel, vocabulary-parallel embedding and head) in two real
  processes equal the unsharded computation;
- TP=2 gives the same greedy tokens as TP=1 and as transformers (batch of prompts, chunked prefill),
  and the same seeded random samples with penalties and logprobs;
- dummy weights are the same model at every TP size; the async Engine runs TP=2;
- a head count tp does not divide fails before any process starts; workers are gone after
  shutdown; a worker that dies surfaces as WorkerProcessError on rank 0 instead of a hang.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import shutil
import signal
import socket
import time

import pytest
import torch
import torch.nn.functional as F

from aioinfer import LLM, Engine, SamplingParams
from aioinfer.errors import TensorParallelError, WorkerProcessError
from engine_streams import generate_all
from tiny_models import make_tiny_model_dir

MAX_TOKENS = 10
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
SEEDED = SamplingParams(temperature=0.9, top_p=0.9, seed=7, repetition_penalty=1.3, logprobs=3,
                        max_tokens=MAX_TOKENS, ignore_eos=True)
OPTIONS = dict(dtype="float32", device="cpu")


def _prompts(vocab: int) -> list[list[int]]:
    rng = random.Random(1)
    return [[rng.randrange(vocab) for _ in range(n)] for n in (1, 5, 17, 33, 60, 9)]


def _tokens(outputs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outputs]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# --------------------------------------------------------------------------- layers, in two processes

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _check_layers(rank: int, port: int) -> None:
    """Runs in each of two spawned processes: every split layer equals the unsharded computation."""
    from aioinfer.distributed.group import destroy_tp_group, init_tp_group
    from aioinfer.layers.embedding import LMHead, VocabEmbedding
    from aioinfer.layers.linear import MergedLinear, QKVLinear, RowParallelLinear

    tp = init_tp_group(rank, 2, f"tcp://127.0.0.1:{port}", torch.device("cpu"))
    try:
        torch.manual_seed(0)  # every rank draws the same whole tensors
        hidden, vocab, head_dim = 8, 11, 2  # odd vocabulary: the last rank holds a padding row
        x = torch.randn(5, hidden)

        qkv_w = {name: torch.randn(rows * head_dim, hidden) for name, rows in (("q", 4), ("k", 2), ("v", 2))}
        qkv_b = {name: torch.randn(w.shape[0]) for name, w in qkv_w.items()}
        qkv = QKVLinear(hidden, head_dim, 4, 2, bias=True, tp=tp)
        for name in "qkv":
            qkv.weight_loader(qkv.weight, qkv_w[name], name)
            qkv.weight_loader(qkv.bias, qkv_b[name], name)
        out = qkv(x)  # [5, this rank's q | k | v]
        for i, name in enumerate("qkv"):
            whole = F.linear(x, qkv_w[name], qkv_b[name])
            size = whole.shape[1] // 2
            start = sum(qkv.output_sizes[:i])
            torch.testing.assert_close(out[:, start:start + size], whole[:, rank * size:(rank + 1) * size])

        gate, up = torch.randn(6, hidden), torch.randn(6, hidden)
        merged = MergedLinear(hidden, [6, 6], tp=tp)
        merged.weight_loader(merged.weight, gate, 0)
        merged.weight_loader(merged.weight, up, 1)
        torch.testing.assert_close(merged(x), torch.cat([F.linear(x, gate)[:, 3 * rank:3 * rank + 3],
                                                         F.linear(x, up)[:, 3 * rank:3 * rank + 3]], dim=1))

        down_w, down_b, act = torch.randn(hidden, 6), torch.randn(hidden), torch.randn(5, 6)
        down = RowParallelLinear(6, hidden, bias=True, tp=tp)
        down.weight_loader(down.weight, down_w)
        down.weight_loader(down.bias, down_b)
        torch.testing.assert_close(down(act[:, 3 * rank:3 * rank + 3]), F.linear(act, down_w, down_b))

        table = torch.randn(vocab, hidden)
        ids = torch.tensor([0, 5, 6, 10, 3])  # ids on both ranks
        embed, head = VocabEmbedding(vocab, hidden, tp), LMHead(vocab, hidden, tp)
        embed.weight_loader(embed.weight, table)
        head.weight = embed.weight  # tied
        torch.testing.assert_close(embed(ids), F.embedding(ids, table))
        torch.testing.assert_close(head(x), F.linear(x, table))
        assert head(x).shape == (5, vocab)

        # The agreements made over the control group: the KV block count is the smallest of all ranks.
        assert tp.min_int(100 + rank) == 100
        assert tp.broadcast_object({"rank": rank}) == {"rank": 0}
    finally:
        destroy_tp_group()


def test_split_layers_equal_unsharded_in_two_processes():
    torch.multiprocessing.spawn(_check_layers, args=(_free_port(),), nprocs=2)


# --------------------------------------------------------------------------- whole models

@pytest.fixture(scope="module", params=["qwen2", "llama"])
def tiny(request, tmp_path_factory):
    """(model dir, prompts, transformers' greedy continuations). The llama has an odd vocabulary
    (padding on the last rank), an untied head and o_proj bias (row-parallel bias added once)."""
    from transformers import AutoModelForCausalLM

    overrides = {} if request.param == "qwen2" else dict(vocab_size=509, attention_bias=True)
    path = make_tiny_model_dir(tmp_path_factory.mktemp(request.param), arch=request.param, **overrides)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prompts = _prompts(hf.config.vocab_size)
    expected = []
    with torch.no_grad():
        for prompt in prompts:
            out = hf.generate(torch.tensor([prompt]), max_new_tokens=MAX_TOKENS, do_sample=False,
                              attention_mask=torch.ones(1, len(prompt), dtype=torch.long))
            expected.append(out[0, len(prompt):].tolist())
    return path, prompts, expected


def test_tp2_equals_tp1_and_transformers(tiny):
    path, prompts, expected = tiny
    single = LLM(model=str(path), **OPTIONS, max_num_batched_tokens=24)
    with LLM(model=str(path), **OPTIONS, tensor_parallel_size=2, max_num_batched_tokens=24) as llm:
        assert llm.engine.loaded.model.num_kv_heads == 1  # 2 KV heads split over 2 ranks
        steps = llm.engine.num_steps
        greedy = _tokens(llm.generate(prompts, GREEDY, use_tqdm=False))
        assert llm.engine.num_steps - steps > MAX_TOKENS + 60 // 24  # prompts really were chunked
        assert greedy == expected
        assert greedy == _tokens(single.generate(prompts, GREEDY, use_tqdm=False))

        seeded = llm.generate(prompts, SEEDED, use_tqdm=False)
        reference = single.generate(prompts, SEEDED, use_tqdm=False)
        assert _tokens(seeded) == _tokens(reference)
        for got, want in zip(seeded, reference):
            for lp_got, lp_want in zip(got.outputs[0].logprobs, want.outputs[0].logprobs):
                assert lp_got.keys() == lp_want.keys()
                for token_id in lp_want:
                    assert lp_got[token_id].logprob == pytest.approx(lp_want[token_id].logprob, abs=1e-4)
        pids = llm.engine.runner.worker_pids
        assert len(pids) == 1 and _alive(pids[0])
    assert not any(_alive(pid) for pid in pids)  # joined by shutdown
    llm.shutdown()  # idempotent


def test_dummy_weights_are_the_same_model_at_every_tp_size(tmp_path_factory):
    src = make_tiny_model_dir(tmp_path_factory.mktemp("qwen3"), arch="qwen3")  # qk-norm, head_dim != H / heads
    folder = tmp_path_factory.mktemp("qwen3-config-only")
    shutil.copy(src / "config.json", folder / "config.json")
    prompts = _prompts(500)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    single = _tokens(LLM(model=str(folder), load_format="dummy", **OPTIONS).generate(prompts, params, use_tqdm=False))
    with LLM(model=str(folder), load_format="dummy", tensor_parallel_size=2, **OPTIONS) as llm:
        assert _tokens(llm.generate(prompts, params, use_tqdm=False)) == single


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_async_engine_tp2(tiny, anyio_backend):
    path, prompts, expected = tiny
    async with Engine(str(path), **OPTIONS, tensor_parallel_size=2, async_scheduling=True) as engine:
        pids = engine._core.runner.worker_pids
        assert not engine._core.async_scheduling  # turned off under tensor parallelism
        results = await generate_all(engine, prompts, GREEDY)
    assert results == expected
    assert not any(_alive(pid) for pid in pids)


# --------------------------------------------------------------------------- errors

def test_head_count_not_divisible_fails_before_spawning(tmp_path_factory):
    path = make_tiny_model_dir(tmp_path_factory.mktemp("qwen2-3"), arch="qwen2")  # 4 heads, 2 KV heads
    before = set(multiprocessing.active_children())
    with pytest.raises(TensorParallelError, match=r"num_attention_heads \(4\).*num_key_value_heads \(2\)"):
        LLM(model=str(path), **OPTIONS, tensor_parallel_size=3)
    assert set(multiprocessing.active_children()) == before


def test_dead_worker_is_an_error_not_a_hang(tmp_path_factory):
    path = make_tiny_model_dir(tmp_path_factory.mktemp("qwen2-dead"), arch="qwen2")
    prompts = _prompts(500)
    llm = LLM(model=str(path), **OPTIONS, tensor_parallel_size=2)
    try:
        (pid,) = llm.engine.runner.worker_pids
        os.kill(pid, signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(WorkerProcessError, match=f"rank 1 \\(pid {pid}\\)"):
            llm.generate(prompts, GREEDY, use_tqdm=False)
        assert time.monotonic() - start < 30
    finally:
        llm.shutdown()
    assert not _alive(pid)
    # The process group is gone with it: another tensor-parallel engine can start in this process.
    with LLM(model=str(path), **OPTIONS, tensor_parallel_size=2) as again:
        assert len(again.generate(prompts[:1], GREEDY, use_tqdm=False)[0].outputs[0].token_ids) > 0


# --------------------------------------------------------------------------- two GPUs (NCCL)

@pytest.mark.gpu
@pytest.mark.parametrize("enforce_eager", [False, True])
def test_tp2_on_two_gpus_matches_transformers(tmp_path, enforce_eager):
    """NCCL ranks on cuda:0 and cuda:1, decode through captured CUDA graphs (all-reduces inside)."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices")
    from transformers import AutoModelForCausalLM

    path = make_tiny_model_dir(tmp_path, arch="llama", vocab_size=509, attention_bias=True)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prompts = _prompts(509)
    with torch.no_grad():
        expected = [hf.generate(torch.tensor([p]), max_new_tokens=MAX_TOKENS, do_sample=False,
                                attention_mask=torch.ones(1, len(p), dtype=torch.long))[0, len(p):].tolist()
                    for p in prompts]
    with LLM(model=str(path), dtype="float32", device="cuda", attention_backend="triton", tensor_parallel_size=2,
             enforce_eager=enforce_eager, max_num_batched_tokens=24, num_kv_blocks=256) as llm:
        assert (llm.engine.runner.graphs is None) == enforce_eager
        assert _tokens(llm.generate(prompts, GREEDY, use_tqdm=False)) == expected
