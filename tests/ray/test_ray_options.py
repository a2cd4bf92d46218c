"""The Ray deployment's settings and messages, without Ray: ``build_app``'s arguments and ``serve --ray``'s
flags read from the declarations, the deployment options in Ray's terms, the error messages between a
replica and the ingress, and ``serve --ray`` where Ray is not installed."""

from __future__ import annotations

import subprocess
import sys

import pytest

from aioinfer.core.scheduler import RequestTooLongError
from aioinfer.entrypoints.ray_app import engine_config_of, settings_of
from aioinfer.entrypoints.serve_cli import ray_options_from_args
from aioinfer.errors import AdmissionLimitExceeded, EngineDeadError, EngineOverloaded
from aioinfer.ray.options import DEFAULT_TARGET_ONGOING_REQUESTS, RayServeOptions
from aioinfer.ray.wire import ERROR, error_message, error_of
from aioinfer.structured_output.limits import ConstraintLimitError
from serve_runs import ROOT, assert_one_line_error, parse, run_serve


def test_build_app_arguments_are_serve_s_options_by_name(tmp_path):
    config, options = settings_of({"model": str(tmp_path), "max_model_len": "2k", "enforce_eager": "true",
                                   "api_key": "k", "num_replicas": "3", "num_cpus_per_replica": 0,
                                   "max_n": 4}, environ={"AIOINFER_MAX_N": "9", "AIOINFER_INGRESS_REPLICAS": "2"})
    assert config.model == str(tmp_path) and config.api_key == "k" and config.max_n == 4
    assert config.engine_kwargs == {"max_model_len": 2000, "enforce_eager": True}
    assert (options.num_replicas, options.num_cpus_per_replica, options.ingress_replicas) == (3, 0, 2)
    with pytest.raises(ValueError, match="unknown argument 'replicas'"):
        settings_of({"replicas": "2"}, environ={})
    with pytest.raises(ValueError, match="max_model_len"):
        settings_of({"max_model_len": "lots"}, environ={})
    with pytest.raises(ValueError, match="num_replicas must be a positive integer"):
        settings_of({"num_replicas": 0}, environ={})


def test_serve_flags_beat_the_variables():
    args = parse(["--ray", "--num-replicas", "2", "--num-gpus-per-replica", "0.5"])
    options = ray_options_from_args(args, {"AIOINFER_NUM_REPLICAS": "5", "AIOINFER_ROUTE_PREFIX_BLOCKS": "2"})
    assert (options.ray, options.num_replicas, options.num_gpus_per_replica, options.route_prefix_blocks) == \
        (True, 2, 0.5, 2)
    assert ray_options_from_args(parse([]), {}) == RayServeOptions()


def test_deployment_options_in_ray_s_terms():
    fixed = RayServeOptions(num_replicas=2).engine_deployment_options("cpu", 1, 10)
    assert fixed["num_replicas"] == 2 and "autoscaling_config" not in fixed
    assert fixed["ray_actor_options"] == {"num_cpus": 1.0, "num_gpus": 0}
    assert fixed["graceful_shutdown_timeout_s"] == 10 and fixed["max_ongoing_requests"] == 1024
    scaled = RayServeOptions(max_replicas=4).engine_deployment_options("cuda", 2, 0)
    assert scaled["autoscaling_config"] == {"min_replicas": 1, "max_replicas": 4,
                                            "target_ongoing_requests": DEFAULT_TARGET_ONGOING_REQUESTS}
    assert "num_replicas" not in scaled and scaled["ray_actor_options"]["num_gpus"] == 2  # one GPU per rank
    assert scaled["graceful_shutdown_timeout_s"] == 1.0
    assert RayServeOptions(num_gpus_per_replica=0.5).engine_deployment_options("auto", 1, 5)[
        "ray_actor_options"]["num_gpus"] == 0.5
    assert RayServeOptions(ingress_replicas=2, ingress_num_cpus=0).ingress_deployment_options() == {
        "num_replicas": 2, "max_ongoing_requests": 4096, "ray_actor_options": {"num_cpus": 0}}
    for bad, match in (({"num_replicas": 2, "max_replicas": 3}, "exclude each other"),
                       ({"min_replicas": 1}, "needs max_replicas"),
                       ({"min_replicas": 3, "max_replicas": 2}, "exceeds max_replicas")):
        with pytest.raises(ValueError, match=match):
            RayServeOptions(**bad)


def test_data_parallel_size_is_refused_for_replicas(tmp_path):
    config, _ = settings_of({"model": str(tmp_path), "data_parallel_size": "2"}, environ={})
    with pytest.raises(ValueError, match="^data_parallel_size > 1 .* num_replicas"):
        engine_config_of(config)


@pytest.mark.parametrize("exc", [
    EngineOverloaded("full", retry_after=7.5),
    AdmissionLimitExceeded("too many", "max_waiting_requests", 4, 9),
    RequestTooLongError("This model's maximum context length is 256 tokens."),
    ConstraintLimitError("the schema is too deep"),
    ValueError("temperature must be >= 0"),
    EngineDeadError("the step loop failed"),
])
def test_errors_cross_as_the_same_exception(exc):
    message = error_message(exc)
    assert message[0] == ERROR
    back = error_of(message)
    assert type(back) is type(exc) and str(back) == str(exc)
    assert vars(back) == vars(exc)  # retry_after, the admission bound's fields


def test_an_unknown_error_is_a_server_error():
    back = error_of(error_message(KeyError("x")))
    assert type(back) is RuntimeError and "KeyError" in str(back)


def test_serve_ray_without_ray_is_one_line_naming_the_extra():
    code = ("import sys; sys.modules['ray'] = None\n"  # an environment without Ray: `import ray` fails
            "from aioinfer.entrypoints.serve_cli import main\n"
            "main(['--ray', '--device', 'cpu'])")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert_one_line_error(result, 2, "--ray needs Ray Serve", "pip install 'aioinfer[ray]'")


def test_serve_ray_settings_are_checked_before_anything_starts():
    result = run_serve(["--ray", "--num-replicas", "2", "--max-replicas", "3"])
    assert_one_line_error(result, 2, "num_replicas and max_replicas exclude each other")


def test_replicas_that_do_not_fit_the_local_cluster_are_refused_with_the_reason():
    from aioinfer.ray.options import RayServeOptions

    two = RayServeOptions(ray=True, num_replicas=2)  # 1 CPU each, and one ingress with 1 CPU
    problem = two.unschedulable("cpu", 1, {"CPU": 2.0})
    assert problem is not None and "need 3 CPUs" in problem and "has 2" in problem
    assert two.unschedulable("cpu", 1, {"CPU": 3.0}) is None
    light = RayServeOptions(ray=True, num_replicas=4, num_cpus_per_replica=0, ingress_num_cpus=0)
    assert light.unschedulable("cpu", 1, {"CPU": 2.0}) is None
    gpus = RayServeOptions(ray=True, num_replicas=2)
    assert "need 2 GPUs" in gpus.unschedulable("cuda", 1, {"CPU": 16.0, "GPU": 1.0})
    shared = RayServeOptions(ray=True, num_replicas=4, num_gpus_per_replica=0.25)
    assert shared.unschedulable("cuda", 1, {"CPU": 16.0, "GPU": 1.0}) is None
    autoscaled = RayServeOptions(ray=True, min_replicas=3, max_replicas=8)  # the minimum must fit at start
    assert "need 3 GPUs" in autoscaled.unschedulable("cuda", 1, {"CPU": 16.0, "GPU": 2.0})


@pytest.mark.parametrize("options, environ, expected", [
    (RayServeOptions(ray=True, ray_high_throughput=True), {}, "1"),  # its own cluster
    (RayServeOptions(ray=True, ray_high_throughput=True),
     {"RAY_SERVE_ENABLE_HA_PROXY": "0", "RAY_SERVE_THROUGHPUT_OPTIMIZED": "0"}, "0"),  # the user's word stands
    (RayServeOptions(ray=True), {}, None),  # off by default
    (RayServeOptions(ray=True, ray_high_throughput=True, ray_address="auto"), {}, None),  # a cluster's own
])
def test_serve_ray_high_throughput_starts_its_own_cluster_in_that_mode(monkeypatch, tmp_path, options, environ,
                                                                     expected):
    """The variables must be in the environment before Ray starts (every Ray process reads them at
    its start): ``run_with_ray`` sets them ahead of ``ray.init``, unless the user set them."""
    import os
    import types

    from aioinfer.entrypoints import ray_app
    from aioinfer.ray.options import HIGH_THROUGHPUT_ENV
    from aioinfer.server_config import ServerConfig

    class Started(Exception):
        pass

    seen = {}

    def init(**kwargs):
        seen.update({name: os.environ.get(name) for name in HIGH_THROUGHPUT_ENV})
        raise Started

    fake = types.ModuleType("ray")
    fake.init, fake.serve = init, types.ModuleType("ray.serve")
    monkeypatch.setitem(sys.modules, "ray", fake)
    monkeypatch.setitem(sys.modules, "ray.serve", fake.serve)
    monkeypatch.setattr(ray_app, "build_application", lambda config, options: None)
    monkeypatch.setattr(os, "environ", {k: v for k, v in os.environ.items() if k not in HIGH_THROUGHPUT_ENV}
                        | environ)
    with pytest.raises(Started):
        ray_app.run_with_ray(ServerConfig(model=str(tmp_path)), options, "127.0.0.1", 0)
    assert seen == dict.fromkeys(HIGH_THROUGHPUT_ENV, expected)
