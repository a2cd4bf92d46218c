"""The Ray Serve deployment's settings, each declared once as an option (options.py): how many engine
replicas (or the autoscaling bounds), what each one reserves, the request router's two knobs and
the ingress. ``serve --ray``'s flags, the ``AIOINFER_*`` variables and ``build_app``'s arguments
(``serve run aioinfer.entrypoints.ray_app:build_app num_replicas=2``) are all read from these
declarations, and docs/server.md's table lists them.

The engine's and the server's own options are not repeated here: a Ray deployment takes exactly the
ones ``serve`` takes (``ServerConfig`` and the engine's), and passes them to every engine replica
and to the ingress. This module imports no Ray: ``serve --help`` shows the flags without it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from aioinfer.options import check_values, declared, option, read_env

# Ray Serve's high-throughput mode (Ray 2.56+): gRPC between the ingress and the engine replicas, and
# HAProxy (shipped with ray[serve]) in front instead of Ray's Python HTTP proxy. Read by every Ray
# process at its start, so set before a local cluster starts (``run_with_ray``), or on ``ray start``.
HIGH_THROUGHPUT_ENV = ("RAY_SERVE_THROUGHPUT_OPTIMIZED", "RAY_SERVE_ENABLE_HA_PROXY")

# Ray Serve's default target is 2 open requests per replica, made for models that answer one request
# at a time; an engine batches dozens, so the autoscaler should add a replica only well beyond that.
DEFAULT_TARGET_ONGOING_REQUESTS = 32.0


@dataclass(frozen=True, slots=True)
class RayServeOptions:
    ray: bool = option(False, help="serve through Ray Serve: engine replicas in Ray actors behind the OpenAI "
                       "routes, prefix-aware routing (docs/scaling.md; needs pip install aioinfer[ray])")
    ray_address: Optional[str] = option(None, help="with --ray: the Ray cluster to join (ray.init's address: auto, "
                                        "ray://HOST:10001; default: start a local one)")
    num_replicas: Optional[int] = option(None, minimum=1, help="with --ray: engine replicas (default: 1; not with "
                                         "--max-replicas)")
    min_replicas: Optional[int] = option(None, minimum=0, help="with --ray: autoscaling's least engine replicas "
                                         "(default: 1)")
    max_replicas: Optional[int] = option(None, minimum=1, help="with --ray: autoscale the engine replicas up to "
                                         "this many (default: a fixed --num-replicas)")
    target_ongoing_requests: Optional[float] = option(
        None, above=0, help="with --ray: autoscaling's target of open requests per engine replica (default: "
        f"{DEFAULT_TARGET_ONGOING_REQUESTS:g})")
    max_ongoing_requests: int = option(1024, minimum=1, help="with --ray: requests Ray sends one engine replica "
                                       "at once; more wait in Ray's queue (the engine's own bounds answer 429 "
                                       "before)")
    num_gpus_per_replica: Optional[float] = option(None, minimum=0, help="with --ray: GPUs each engine replica "
                                                   "reserves (default: 0 with --device cpu, else "
                                                   "--tensor-parallel-size)")
    num_cpus_per_replica: float = option(1.0, minimum=0, help="with --ray: CPUs each engine replica reserves")
    ingress_replicas: int = option(1, minimum=1, help="with --ray: replicas of the OpenAI ingress (tokenizing, "
                                   "templates, SSE)")
    ingress_num_cpus: float = option(1.0, minimum=0, help="with --ray: CPUs each ingress replica reserves")
    ingress_max_ongoing_requests: int = option(4096, minimum=1, help="with --ray: HTTP requests one ingress "
                                               "replica serves at once")
    route_prefix_blocks: int = option(4, minimum=1, help="with --ray: leading KV blocks of a prompt that decide "
                                      "its replica (prompts sharing them go to one replica)")
    ray_high_throughput: bool = option(False, help="with --ray and its own local Ray cluster: Ray Serve's "
                                       "high-throughput mode (RAY_SERVE_THROUGHPUT_OPTIMIZED=1, "
                                       "RAY_SERVE_ENABLE_HA_PROXY=1, unless set): gRPC between replicas and HAProxy "
                                       "in front; 10x the streamed tokens of Ray's defaults at 256 streams, but "
                                       "Ray 2.60 leaves its HAProxy running after shutdown (docs/scaling.md). On a "
                                       "cluster of --ray-address, set them on ray start")
    routing_imbalance_threshold: int = option(8, minimum=0, help="with --ray: open requests the replica a prompt "
                                              "prefers may have beyond the least busy one before the prompt "
                                              "goes elsewhere")

    def __post_init__(self) -> None:
        check_values(self)
        if self.num_replicas is not None and self.max_replicas is not None:
            raise ValueError("num_replicas and max_replicas exclude each other: a fixed number of engine "
                             "replicas, or autoscaling up to max_replicas")
        if self.min_replicas is not None and self.max_replicas is None:
            raise ValueError("min_replicas needs max_replicas (autoscaling)")
        if self.max_replicas is not None and (self.min_replicas or 0) > self.max_replicas:
            raise ValueError(f"min_replicas {self.min_replicas} exceeds max_replicas {self.max_replicas}")

    @classmethod
    def from_env(cls, environ: Optional[Mapping[str, str]] = None) -> "RayServeOptions":
        return cls(**read_env(declared(cls), os.environ if environ is None else environ))

    def engine_deployment_options(self, device: str, tensor_parallel_size: int, graceful_shutdown_s: float) -> dict:
        """``serve.deployment(...).options(...)``'s arguments for the engine replicas, in Ray's terms."""
        gpus = self.num_gpus_per_replica
        if gpus is None:
            gpus = 0 if device == "cpu" else tensor_parallel_size
        options: dict[str, Any] = {
            "max_ongoing_requests": self.max_ongoing_requests,
            "ray_actor_options": {"num_cpus": self.num_cpus_per_replica, "num_gpus": gpus},
            "graceful_shutdown_timeout_s": max(1.0, graceful_shutdown_s),  # open requests may finish, as serve's
        }
        if self.max_replicas is not None:
            options["autoscaling_config"] = {
                "min_replicas": 1 if self.min_replicas is None else self.min_replicas,
                "max_replicas": self.max_replicas,
                "target_ongoing_requests": self.target_ongoing_requests or DEFAULT_TARGET_ONGOING_REQUESTS}
        else:
            options["num_replicas"] = self.num_replicas or 1
        return options

    def ingress_deployment_options(self) -> dict:
        return {"num_replicas": self.ingress_replicas, "max_ongoing_requests": self.ingress_max_ongoing_requests,
                "ray_actor_options": {"num_cpus": self.ingress_num_cpus}}

    def unschedulable(self, device: str, tensor_parallel_size: int, resources: Mapping[str, float]) -> Optional[str]:
        """Why the replicas Ray must start first (the fixed count, or autoscaling's minimum) and the
        ingress replicas cannot all be placed on a cluster of ``resources`` (``ray.cluster_resources()``),
        or None when they fit. Ray itself would wait for them for ever, saying only that they take long
        to be scheduled."""
        engine = self.engine_deployment_options(device, tensor_parallel_size, 1.0)
        replicas = engine.get("num_replicas") or engine["autoscaling_config"]["min_replicas"]
        per = engine["ray_actor_options"]
        cpus = replicas * per["num_cpus"] + self.ingress_replicas * self.ingress_num_cpus
        gpus = replicas * per["num_gpus"]
        have_cpus, have_gpus = resources.get("CPU", 0.0), resources.get("GPU", 0.0)
        if cpus > have_cpus + 1e-9:
            return (f"{replicas} engine replica(s) x {per['num_cpus']:g} CPU + {self.ingress_replicas} ingress "
                    f"replica(s) x {self.ingress_num_cpus:g} CPU need {cpus:g} CPUs; the Ray cluster has "
                    f"{have_cpus:g}: lower --num-cpus-per-replica / --ingress-num-cpus (Ray's CPUs are reservations, "
                    "0 is allowed) or the replica counts")
        if gpus > have_gpus + 1e-9:
            return (f"{replicas} engine replica(s) x {per['num_gpus']:g} GPU need {gpus:g} GPUs; the Ray cluster has "
                    f"{have_gpus:g}: set --num-gpus-per-replica (a fraction shares a GPU) or fewer replicas")
        return None
