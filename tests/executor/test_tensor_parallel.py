"""Tensor parallelism over gloo on the CPU: real worker processes, real checkpoints.

- the split layers (column / row parallel, vocabulary-parallel embedding and head) in two real
  processes equal the unsharded computation;
- TP=2 gives the same greedy tokens as TP=1 and as transformers (batch of prompts, chunked prefill),
  and the same seeded random samples with penalties and logprobs;
- dummy weights are the same model at every TP size; the async Engine runs TP=2;
- async scheduling at TP=2 (look-ahead steps whose input tokens each rank takes from its own
  sampled ids) gives TP=1's tokens and logprobs: chunked prefill, penalties (no look-ahead while a
  running request has one), mixed batches, aborts of requests whose next step is already launched;
  a worker launches and collects in rank 0's order; the step channel round-trips every step type
  and drops a client without the secret;
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
from engine_streams import generate_all
from tiny_models import make_tiny_model_dir

from aioinfer import LLM, Engine, SamplingParams
from aioinfer.errors import TensorParallelError, WorkerProcessError

MAX_TOKENS = 10
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
SEEDED = SamplingParams(temperature=0.9, top_p=0.9, seed=7, repetition_penalty=1.3, logprobs=3,
                        max_tokens=MAX_TOKENS, ignore_eos=True)
OPTIONS = {"dtype": "float32", "device": "cpu"}


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

    overrides = {} if request.param == "qwen2" else {"vocab_size": 509, "attention_bias": True}
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
        assert not llm.engine.async_scheduling  # the default on the CPU
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
        pids = llm.engine.executor.worker_pids
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
        pids = engine._core.executor.worker_pids
        assert engine._core.async_scheduling
        results = await generate_all(engine, prompts, GREEDY)
        # Left mid-stream: shutdown must drain the step launched ahead, on every rank.
        stream = engine.generate(prompts[2], SamplingParams(temperature=0, max_tokens=300, ignore_eos=True))
        await stream.__anext__()
    assert results == expected
    assert not any(_alive(pid) for pid in pids)


# --------------------------------------------------------------------------- async scheduling

def _record_look_ahead(llm) -> list[int]:
    """Rank 0's count of launched, uncollected steps at each launch (> 0: a look-ahead launch)."""
    executor = llm.engine.executor
    seen: list[int] = []
    launch = executor.launch

    def recording(scheduler_output):
        seen.append(executor._uncollected)
        return launch(scheduler_output)

    executor.launch = recording
    return seen


def test_async_tp2_equals_tp1_and_transformers(tiny):
    path, prompts, expected = tiny
    single = LLM(model=str(path), **OPTIONS, max_num_batched_tokens=24)
    with LLM(model=str(path), **OPTIONS, tensor_parallel_size=2, max_num_batched_tokens=24,
             async_scheduling=True) as llm:
        assert llm.engine.async_scheduling
        seen = _record_look_ahead(llm)
        steps = llm.engine.num_steps
        greedy = _tokens(llm.generate(prompts, GREEDY, use_tqdm=False))
        assert llm.engine.num_steps - steps > MAX_TOKENS + 60 // 24  # prompts really were chunked
        assert max(seen) == 1 and seen.count(1) > MAX_TOKENS  # steps really were launched ahead
        assert greedy == expected
        assert greedy == _tokens(single.generate(prompts, GREEDY, use_tqdm=False))

        # Random samples and logprobs: any rank whose look-ahead input differed from rank 0's would
        # corrupt its half of the KV cache and move these.
        sampled = SamplingParams(temperature=0.9, top_p=0.9, seed=7, logprobs=3, max_tokens=MAX_TOKENS,
                                 ignore_eos=True)
        _assert_same_samples(llm.generate(prompts, sampled, use_tqdm=False),
                             single.generate(prompts, sampled, use_tqdm=False))

        # Penalties: no look-ahead at all while such a request runs.
        del seen[:]
        _assert_same_samples(llm.generate(prompts, SEEDED, use_tqdm=False),
                             single.generate(prompts, SEEDED, use_tqdm=False))
        assert set(seen) == {0}

        # Mixed: look-ahead stops while the penalised requests run and resumes once they are done.
        del seen[:]
        mixed = [SamplingParams(temperature=0.9, seed=i, repetition_penalty=1.3, max_tokens=3, ignore_eos=True)
                 if i % 2 else SamplingParams(temperature=0.8, seed=i, max_tokens=3 * MAX_TOKENS, ignore_eos=True)
                 for i in range(len(prompts))]
        _assert_same_samples(llm.generate(prompts, mixed, use_tqdm=False),
                             single.generate(prompts, mixed, use_tqdm=False))
        assert 0 in seen and 1 in seen


def test_tp2_structured_outputs_equal_tp1(tiny):
    """Rank 0 computes the masks and broadcasts them in the step; both ranks sample under them, with
    async scheduling asked for (grammar steps then run in lockstep), greedy and seeded."""
    import re

    from aioinfer.structured_output import StructuredOutputsParams

    path, prompts, _ = tiny
    pattern = r"[a-z ]{1,24}"
    params = [SamplingParams(temperature=0.0 if i % 2 else 0.8, seed=i, max_tokens=MAX_TOKENS,
                             structured_outputs=StructuredOutputsParams(regex=pattern) if i % 3 else
                             StructuredOutputsParams(choice=["quick brown", "lazy dog", "hello"]))
              for i in range(len(prompts))]
    single = LLM(model=str(path), **OPTIONS)
    want = single.generate(prompts, params, use_tqdm=False)
    with LLM(model=str(path), **OPTIONS, tensor_parallel_size=2, async_scheduling=True) as llm:
        got = llm.generate(prompts, params, use_tqdm=False)
        plain = _tokens(llm.generate(prompts, GREEDY, use_tqdm=False))  # and the ranks agree afterwards
    assert _tokens(got) == _tokens(want)
    for i, out in enumerate(got):
        text = out.outputs[0].text
        assert re.fullmatch(pattern, text) if i % 3 else text in ("quick brown", "lazy dog", "hello"), text
    assert plain == _tokens(single.generate(prompts, GREEDY, use_tqdm=False))


def _assert_same_samples(got, want) -> None:
    assert _tokens(got) == _tokens(want)
    for g, w in zip(got, want):
        for lp_got, lp_want in zip(g.outputs[0].logprobs or [], w.outputs[0].logprobs or []):
            assert lp_got.keys() == lp_want.keys()
            for token_id in lp_want:
                assert lp_got[token_id].logprob == pytest.approx(lp_want[token_id].logprob, abs=1e-4)


def test_async_tp2_aborts_mid_run(tiny):
    """Requests aborted while their next step is already launched on every rank: the others still get
    TP=1's tokens, and the engine (and the workers' request state) serves the same prompts again."""
    path, prompts, expected = tiny
    with LLM(model=str(path), **OPTIONS, tensor_parallel_size=2, max_num_batched_tokens=24,
             async_scheduling=True) as llm:
        core = llm.engine
        for i, prompt in enumerate(prompts):
            core.add_request(llm.inputs.make_request(f"r{i}", prompt, GREEDY))
        tokens: dict[str, list[int]] = {f"r{i}": [] for i in range(len(prompts))}
        aborted = ["r1", "r4"]
        num_steps = 0
        while core.has_unfinished():
            for out in core.step():
                tokens[out.request_id] += out.new_token_ids
            num_steps += 1
            if num_steps == 6:
                assert core._in_flight is not None  # the next step is out, aborted requests included
                assert sorted(core.finish_requests(aborted)) == aborted
        for i in range(len(prompts)):
            got = tokens[f"r{i}"]
            if f"r{i}" in aborted:
                assert len(got) < MAX_TOKENS and got == expected[i][:len(got)]
            else:
                assert got == expected[i]
        assert core.kv_cache.all_free()
        assert _tokens(llm.generate(prompts, GREEDY, use_tqdm=False)) == expected


class _Recorder:
    """A ModelRunner stand-in that logs the order of its launches and collects."""

    def __init__(self) -> None:
        self.log: list[str] = []

    def launch(self, step: str) -> str:
        self.log.append(f"launch {step}")
        return step

    def collect(self, step: str) -> None:
        self.log.append(f"collect {step}")


def test_worker_launches_and_collects_in_rank0_order():
    from aioinfer.executor.tp_worker import replay

    # Rank 0: launch a; launch b ahead; collect a; launch c ahead; collect b; collect c (drain);
    # launch d without look-ahead (penalties); collect d; launch e.
    messages = iter([(0, "a"), (1, "b"), (1, "c"), (0, "d"), (0, "e"), None])

    class Channel:
        def recv(self):
            return next(messages)

    runner = _Recorder()
    replay(Channel(), runner)
    assert runner.log == ["launch a", "launch b", "collect a", "launch c", "collect b", "collect c",
                          "launch d", "collect d", "launch e"]


def test_step_channel_round_trips_steps_and_drops_strangers():
    import threading

    from aioinfer.core import scheduler_output as so
    from aioinfer.executor.step_channel import StepReceiver, StepSender, dumps

    box, ready = [], threading.Event()

    class Group:  # the control group of two ranks in one process: broadcast_object through a box
        world_size = 2

        def __init__(self, rank):
            self.rank = rank

        def broadcast_object(self, obj=None):
            if self.rank == 0:
                box.append(obj)
                ready.set()
                return obj
            ready.wait(10)
            return box[0]

    step = so.SchedulerOutput(
        scheduled=[so.ScheduledRequest("a", [1, 2, 3], 0, [4, 5], True), so.ScheduledRequest("b", [-1], 9, [7], False)],
        new_requests=[so.NewRequestData("a", [1, 2, 3], SamplingParams(temperature=0.5, stop=["x"], logit_bias={3: 1.0}),
                                        11, (0, 2))],
        finished_request_ids=["z"], num_scheduled_tokens=4, num_preempted=1,
        swap_out=[so.SwapOut("c", (1, 2), 0)], swap_in=[so.SwapIn("d", 0, (3, 4))], num_prefix_cache_queries=3)
    empty = so.SchedulerOutput([], [], [], 0)
    assert len(dumps(step)) < len(__import__("pickle").dumps(step))

    def stranger():
        ready.wait(10)
        with socket.create_connection(("127.0.0.1", box[0][0])) as sock:
            sock.sendall(b"not the secret" + bytes(18))
            sock.recv(1)  # closed by rank 0

    received = []

    def worker():
        ready.wait(10)
        time.sleep(0.2)  # the stranger connects first
        receiver = StepReceiver(Group(1), "tcp://127.0.0.1:1")
        while (obj := receiver.recv()) is not None:
            received.append(obj)
        receiver.close()

    threads = [threading.Thread(target=stranger), threading.Thread(target=worker)]
    for thread in threads:
        thread.start()
    sender = StepSender(Group(0), "tcp://127.0.0.1:1", timeout_s=10)
    for message in [(0, step), (1, empty), None]:
        sender.send(message)
    for thread in threads:
        thread.join(10)
    sender.close()
    assert received == [(0, step), (1, empty)]


def test_step_channel_is_a_socket_on_one_machine_and_gloo_across_machines(monkeypatch):
    """Between machines everything goes through torch.distributed: the socket is a loopback shortcut."""
    from aioinfer.executor.step_channel import GlooStepChannel, open_step_receiver, open_step_sender, same_machine

    assert same_machine("tcp://127.0.0.1:29500") and same_machine("tcp://localhost:1")
    assert not same_machine("tcp://192.0.2.7:29500")  # TEST-NET-1: another machine
    monkeypatch.setenv("MASTER_ADDR", "192.0.2.7")
    monkeypatch.setenv("MASTER_PORT", "29500")
    assert not same_machine("env://")

    sent = []

    class Group:  # rank 0 and a worker over one "broadcast": the worker reads what rank 0 sent
        world_size = 2

        def broadcast_object(self, obj=None):
            if obj is not None:
                sent.append(obj)
                return obj
            return sent.pop(0)

    sender, receiver = open_step_sender(Group(), "env://", 1), open_step_receiver(Group(), "env://")
    assert isinstance(sender, GlooStepChannel) and isinstance(receiver, GlooStepChannel)
    sender.send((0, "step"))
    assert receiver.recv() == (0, "step")
    sender.close(), receiver.close()


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
        (pid,) = llm.engine.executor.worker_pids
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
@pytest.mark.parametrize("symm_mem", [False, True])
@pytest.mark.parametrize("enforce_eager", [False, True])
def test_tp2_on_two_gpus_matches_transformers(tmp_path, enforce_eager, symm_mem):
    """NCCL ranks on cuda:0 and cuda:1, decode through captured CUDA graphs (all-reduces inside),
    async scheduling on (the CUDA default); optionally the symmetric-memory all-reduce.

    The engine runs in a fresh process, as a server runs it: torch keeps symmetric-memory state per
    process group name for the life of a process (symm_all_reduce.py), so a second engine in one
    process falls back to NCCL (tested on CPU below)."""
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
    torch.multiprocessing.spawn(_tp2_engine_case, args=(str(path), enforce_eager, symm_mem, prompts, expected),
                                nprocs=1)


def _tp2_engine_case(_index: int, path: str, enforce_eager: bool, symm_mem: bool, prompts, expected) -> None:
    os.environ["AIOINFER_TP_SYMM_MEM"] = "1" if symm_mem else "0"  # read by rank 0, inherited by the worker
    with LLM(model=path, dtype="float32", device="cuda", attention_backend="triton", tensor_parallel_size=2,
             enforce_eager=enforce_eager, max_num_batched_tokens=24, num_kv_blocks=256) as llm:
        assert (llm.engine.executor.runner.graphs is None) == enforce_eager
        assert llm.engine.async_scheduling
        assert (llm.engine.executor.group.fast_all_reduce is not None) == symm_mem
        assert _tokens(llm.generate(prompts, GREEDY, use_tqdm=False)) == expected


def test_symm_mem_is_set_up_once_per_group_name(monkeypatch, caplog):
    """torch cannot register a process group name with symmetric memory twice in one process (a
    second registration raises; its Python side keeps the first store), which left a second
    tensor-parallel engine's ranks waiting in different stores. A name already used falls back to
    NCCL with a warning, agreed by every rank. (One gloo rank on CPU: only the decision is tested.)"""
    import logging

    import torch.distributed as dist
    from torch._C._distributed_c10d import HashStore, _SymmetricMemory

    from aioinfer.distributed import symm_all_reduce

    store = HashStore()  # the torch behaviour the guard is for
    _SymmetricMemory.set_group_info("aioinfer-test-group", 0, 1, store)
    with pytest.raises(Exception):
        _SymmetricMemory.set_group_info("aioinfer-test-group", 0, 1, HashStore())

    monkeypatch.setenv(symm_all_reduce.ENV_FLAG, "1")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    try:
        world = dist.group.WORLD
        monkeypatch.setattr(symm_all_reduce, "_USED_GROUP_NAMES", {world.group_name})
        with caplog.at_level(logging.WARNING, logger=symm_all_reduce.__name__):
            assert symm_all_reduce.SymmMemAllReduce.create(world, world, torch.device("cuda", 0)) is None
        assert "already set up symmetric memory" in caplog.text
        caplog.clear()
        monkeypatch.setattr(symm_all_reduce, "_USED_GROUP_NAMES", set())
        with caplog.at_level(logging.WARNING, logger=symm_all_reduce.__name__):
            assert symm_all_reduce.SymmMemAllReduce.create(world, world, torch.device("cpu")) is None
        assert "already set up" not in caplog.text and "needs every rank" in caplog.text
        caplog.clear()
        monkeypatch.delenv(symm_all_reduce.ENV_FLAG)  # the default: on where usable, silent where not
        with caplog.at_level(logging.WARNING, logger=symm_all_reduce.__name__):
            assert symm_all_reduce.SymmMemAllReduce.create(world, world, torch.device("cpu")) is None
        assert not caplog.text
    finally:
        dist.destroy_process_group()


def _check_symm_mem_all_reduce(rank: int, port: int) -> None:
    """Runs on cuda:0 and cuda:1: the one-shot path against NCCL, eager and inside a CUDA graph."""
    import torch.distributed as dist

    from aioinfer.distributed.group import destroy_tp_group, init_tp_group

    os.environ["AIOINFER_TP_SYMM_MEM"] = "1"
    device = torch.device(f"cuda:{rank}")
    tp = init_tp_group(rank, 2, f"tcp://127.0.0.1:{port}", device)
    try:
        fast = tp.fast_all_reduce
        assert fast is not None
        generator = torch.Generator().manual_seed(rank)
        for dtype in (torch.bfloat16, torch.float32):
            for shape in ((1, 3584), (7, 64), (64, 3584), (1024, 3584)):  # the last one is NCCL's
                x = torch.randn(shape, generator=generator).to(device, dtype)
                want = x.clone()
                dist.all_reduce(want, group=tp.device_group)
                assert fast.accepts(x) == (x.numel() * x.element_size() <= 512 * 1024)
                got = tp.all_reduce(x.clone())
                torch.testing.assert_close(got, want, rtol=0, atol=0)  # two addends: a + b either way
                both = torch.empty((2,) + shape, dtype=dtype, device=device)
                dist.all_gather_into_tensor(both, got, group=tp.device_group)
                assert torch.equal(both[0], both[1])  # the same bits on every rank

        # Captured: a chain of sums, as a decode graph holds them, replayed twice.
        static = torch.randn((4, 3584), generator=generator).to(device, torch.bfloat16)
        want = static.clone()
        for _ in range(5):
            dist.all_reduce(want, group=tp.device_group)
        torch.cuda.synchronize()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up outside the capture, as the runner does
            tp.all_reduce(static)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = static
            for _ in range(5):
                y = tp.all_reduce(y)
        for _ in range(2):
            graph.replay()
            torch.cuda.synchronize()
            torch.testing.assert_close(y, want, rtol=0, atol=0)
        del graph
        _check_fused_all_reduce_norm(tp, device, generator)
    finally:
        destroy_tp_group()


def _check_fused_all_reduce_norm(tp, device, generator) -> None:
    """The Lamport all-reduce + residual add + RMSNorm kernel (the default) against NCCL + the torch
    path, eager and in a graph."""
    from aioinfer.distributed.lamport_all_reduce_norm import LamportAllReduceNorm

    assert isinstance(tp.fast_all_reduce.fused_norm, LamportAllReduceNorm)
    _check_one_fused_all_reduce_norm(tp, device, generator, "lamport")


def _check_one_fused_all_reduce_norm(tp, device, generator, kind: str) -> None:
    import torch.distributed as dist

    from aioinfer.layers.torch_ops import rms_norm_torch

    def reference(x, residual, weight):
        total = x.clone()
        dist.all_reduce(total, group=tp.device_group)
        s = total + residual
        return rms_norm_torch(s, weight, 1e-6), s

    for dtype in (torch.bfloat16, torch.float32):
        for rows in (1, 3, 8):
            x = torch.randn((rows, 3584), generator=generator).to(device, dtype)
            residual = torch.randn((rows, 3584), generator=generator).to(device, dtype)
            weight = (1 + 0.1 * torch.randn(3584, generator=generator)).to(device, dtype)
            assert tp.fuses_norm(x)
            x[0, :5] = -0.0  # negative zeros: the Lamport kernel's empty marker, sent as +0.0
            for _ in range(4):  # every slot (3) at least once
                out, s = tp.all_reduce_add_rms_norm(x, residual, weight, 1e-6)
                want_out, want_s = reference(x, residual, weight)
                torch.testing.assert_close(s, want_s, rtol=0, atol=0, msg=kind)  # sum and add: same roundings
                torch.testing.assert_close(out, want_out, rtol=1.6e-2 if dtype == torch.bfloat16 else 2e-6,
                                           atol=1e-2 if dtype == torch.bfloat16 else 1e-6)
    # Captured: a chain as a decode graph holds it (5 calls: replays start on different slots).
    x = torch.randn((1, 3584), generator=generator).to(device, torch.bfloat16)
    residual = torch.randn((1, 3584), generator=generator).to(device, torch.bfloat16)
    weight = torch.ones(3584, device=device, dtype=torch.bfloat16)
    want_out, want_s = x, residual
    for _ in range(5):
        want_out, want_s = reference(want_out, want_s, weight)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, s = x, residual
        for _ in range(5):
            out, s = tp.all_reduce_add_rms_norm(out, s, weight, 1e-6)
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(s, want_s, rtol=1.6e-2, atol=1e-1)
        torch.testing.assert_close(out, want_out, rtol=1.6e-2, atol=1e-2)
    del graph


@pytest.mark.gpu
def test_symm_mem_all_reduce_matches_nccl():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices")
    torch.multiprocessing.spawn(_check_symm_mem_all_reduce, args=(_free_port(),), nprocs=2)
