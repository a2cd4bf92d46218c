"""Two engine replicas on two GPUs behind Ray Serve (each replica one whole GPU): each replica gets
its own device, and the deployment answers greedy requests as a single server on one GPU does.

Marked ``gpu`` and skipped below two CUDA devices (the lent machines of the project have one: this
test is written for the two-GPU hosts it will meet). Throughput is not asserted (timing); the figure
to expect comes from the one-GPU runs of ``benchmarks/serve_throughput.py --ray-replicas``
(docs/scaling.md): two whole-GPU replicas should serve at least what two replicas sharing one GPU do.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
import torch

pytestmark = pytest.mark.gpu
serve = pytest.importorskip("ray.serve")
if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
    pytest.skip("needs two CUDA devices", allow_module_level=True)

import ray  # noqa: E402
from openai import OpenAI  # noqa: E402

from aioinfer.entrypoints.ray_app import APP_NAME, ENGINE_DEPLOYMENT, build_app  # noqa: E402
from aioinfer.ray.directory import ReplicaDirectory  # noqa: E402
from server_process import free_port, start_server  # noqa: E402
from tiny_models import make_tiny_model_dir  # noqa: E402

OPTIONS = dict(dtype="float32", device="cuda", max_model_len=256, gpu_memory_utilization=0.3)
PROMPTS = ["Hello, world! How are you", "The quick brown fox", "Count: one, two, three,"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(make_tiny_model_dir(tmp_path_factory.mktemp("qwen2"), arch="qwen2"))


def test_two_replicas_on_two_gpus_answer_as_one_server(model_dir):
    single = start_server({"AIOINFER_" + k.upper(): str(v) for k, v in {**OPTIONS, "model": model_dir}.items()})
    try:
        single_client = OpenAI(base_url=single.url + "/v1", api_key="x", max_retries=0, timeout=120)
        name = single_client.models.list().data[0].id
        expected = [single_client.completions.create(model=name, prompt=p, max_tokens=16, temperature=0).choices[0].text
                    for p in PROMPTS]
    finally:
        single.stop()
        single.close_log()
    port = free_port()
    ray.init(include_dashboard=False, namespace="serve", log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        args = {key: str(value) for key, value in OPTIONS.items()}
        args.update(model=model_dir, num_replicas="2", num_gpus_per_replica="1")
        serve.run(build_app(args), name=APP_NAME, route_prefix="/")
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 300
        while httpx.get(url + "/ready", timeout=10).status_code != 200:
            assert time.monotonic() < deadline, "the deployment was not ready in 300 s"
            time.sleep(0.5)
        directory = ReplicaDirectory(APP_NAME, ENGINE_DEPLOYMENT)
        figures = asyncio.run(directory.routing_stats(directory.actors(), timeout=30))
        gpus = [tuple(f["gpu_ids"]) for f in figures.values()]
        assert len(gpus) == 2 and all(len(g) == 1 for g in gpus) and gpus[0] != gpus[1], gpus
        client = OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)
        got = [client.completions.create(model=name, prompt=p, max_tokens=16, temperature=0).choices[0].text
               for p in PROMPTS]
        assert got == expected
    finally:
        serve.shutdown()
        ray.shutdown()
