"""The ``host_cpu`` option: the event loop's thread and the GPU thread run on the one CPU named,
the outputs are the same as without it, the caller's thread gets its CPUs back at exit, and a CPU
this process may not use is refused up front."""

from __future__ import annotations

import os

import anyio
import pytest

from aioinfer import LLM, Engine, SamplingParams
from engine_streams import collect
from tiny_models import make_tiny_model_dir

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="thread affinity is Linux-only")

OPTIONS = dict(dtype="float32", device="cpu", max_num_batched_tokens=64, cpu_threads=1)
PROMPTS = [[5, 9, 13, 200, 7], list(range(30, 70)), "Hello world"]
GREEDY = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(make_tiny_model_dir(tmp_path_factory.mktemp("qwen2"), arch="qwen2"))


def _thread_cpus(native_id: int) -> set[int]:
    return os.sched_getaffinity(native_id)  # Linux: a thread id names that thread


@pytest.mark.anyio
async def test_both_threads_run_on_the_named_cpu_and_the_loop_thread_gets_its_cpus_back(model_dir):
    before = os.sched_getaffinity(0)
    cpu = max(before)
    want = [o.outputs[0].token_ids for o in LLM(model=model_dir, **OPTIONS).generate(PROMPTS, GREEDY, use_tqdm=False)]
    async with Engine(model_dir, host_cpu=cpu, **OPTIONS) as engine:
        assert os.sched_getaffinity(0) == {cpu}  # this test's thread is the event loop's
        assert _thread_cpus(engine._loop.thread.native_id) == {cpu}
        got = {}

        async def run(i):
            got[i] = (await collect(engine.generate(PROMPTS[i], GREEDY)))[0]

        async with anyio.create_task_group() as tg:
            for i in range(len(PROMPTS)):
                tg.start_soon(run, i)
    assert [got[i] for i in range(len(PROMPTS))] == want
    assert os.sched_getaffinity(0) == before


@pytest.mark.parametrize("bad", [-1, 1.5, True, 10_000])
def test_a_cpu_this_process_may_not_use_is_refused(model_dir, bad):
    with pytest.raises(ValueError, match="host_cpu"):
        Engine(model_dir, host_cpu=bad, **OPTIONS)


@pytest.mark.anyio
async def test_data_parallel_replicas_share_the_cpu_and_the_loop_thread_is_restored_once_all_left(model_dir):
    from aioinfer import DataParallelEngine

    before = os.sched_getaffinity(0)
    cpu = min(before)
    async with DataParallelEngine(model_dir, data_parallel_size=2, host_cpu=cpu, **OPTIONS) as engine:
        assert os.sched_getaffinity(0) == {cpu}
        assert [_thread_cpus(r._loop.thread.native_id) for r in engine.replicas] == [{cpu}, {cpu}]
        tokens = (await collect(engine.generate(PROMPTS[0], GREEDY)))[0]
        assert len(tokens) == GREEDY.max_tokens
    assert os.sched_getaffinity(0) == before  # whichever replica left last restored it
