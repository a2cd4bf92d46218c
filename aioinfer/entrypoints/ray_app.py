"""The Ray Serve application: engine replicas (aioinfer/ray) behind the OpenAI routes of the server.

Two deployments. ``AioinferEngine``: ``EngineReplica``s, one ``Engine`` per Ray actor (a process
with its GPU thread, on its GPUs), routed to by ``PrefixAffinityRouter``. ``AioinferIngress``: the
Quart app of ``aioinfer.app``, whole (routes, errors, API keys, 429s, SSE, /health, /ready,
/metrics), built by ``create_app`` with a ``RayEngine`` over a handle to the engine deployment
instead of a local engine; Ray's HTTP proxy forwards every request to it.

Three ways to run it:

- ``serve run aioinfer.entrypoints.ray_app:build_app model=PATH num_replicas=2``: Ray's convention
  for an application builder. Arguments are the options ``serve`` takes, by option name (the
  server's, the engine's, and ray/options.py's), as text or, from a config file, typed; the
  ``AIOINFER_*`` variables apply below them.
- ``serve run config.yaml`` (``applications: [{import_path: aioinfer.entrypoints.ray_app:build_app,
  args: {...}}]``), and so a KubeRay ``RayService`` (docs/scaling.md).
- ``python -m aioinfer serve --ray --num-replicas 2 MODEL``: starts or joins Ray and serves until
  SIGINT / SIGTERM (``run_with_ray``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import time
from typing import Any, Mapping, Optional

from aioinfer.config import EngineConfig
from aioinfer.options import declared, parse_text
from aioinfer.ray.options import HIGH_THROUGHPUT_ENV, RayServeOptions
from aioinfer.server_config import ServerConfig, engine_option_specs

logger = logging.getLogger("aioinfer.server")

APP_NAME = "aioinfer"
ENGINE_DEPLOYMENT = "AioinferEngine"
INGRESS_DEPLOYMENT = "AioinferIngress"


def build_app(args: dict):
    """Ray Serve's application builder (``serve run aioinfer.entrypoints.ray_app:build_app k=v ...``)."""
    config, options = settings_of(args)
    return build_application(config, options)


def settings_of(args: Mapping[str, Any], environ: Optional[Mapping[str, str]] = None
                ) -> tuple[ServerConfig, RayServeOptions]:
    """The server's settings and the deployment's from builder arguments (option names; text is parsed
    as the option's variable would be), over the ``AIOINFER_*`` variables. ValueError names the argument."""
    server_specs = {spec.name: spec for spec in declared(ServerConfig)}
    engine_specs = {spec.name: spec for spec in engine_option_specs()}
    ray_specs = {spec.name: spec for spec in declared(RayServeOptions) if spec.name != "ray"}
    server: dict[str, Any] = {}
    engine: dict[str, Any] = {}
    ray: dict[str, Any] = {}
    for name, value in args.items():
        for specs, into in ((server_specs, server), (engine_specs, engine), (ray_specs, ray)):
            spec = specs.get(name)
            if spec is not None:
                if isinstance(value, str) and spec.parse is not str:
                    value = parse_text(name, value.strip(), spec.parse)
                into[name] = value
                break
        else:
            raise ValueError(f"unknown argument {name!r}: expected one of serve's options by name (model, "
                             f"max_model_len, api_key, num_replicas, ...; docs/server.md)")
    base = ServerConfig.from_env(environ)
    config = dataclasses.replace(base, engine_kwargs={**base.engine_kwargs, **engine}, **server)
    options = dataclasses.replace(RayServeOptions.from_env(environ), **ray)
    return config, options


def engine_config_of(config: ServerConfig) -> EngineConfig:
    """The engine options checked as the replicas will take them (nothing is loaded)."""
    from aioinfer.fetch import DEFAULT_MODEL
    from aioinfer.server_config import AsyncEngineOptions

    own = {spec.name for spec in declared(AsyncEngineOptions)}
    engine_config = EngineConfig.from_kwargs(config.model or DEFAULT_MODEL,
                                             **{k: v for k, v in config.engine_kwargs.items() if k not in own})
    if engine_config.parallel.data_parallel_size > 1:
        raise ValueError("data_parallel_size > 1 is for one process; under Ray each engine replica is one engine: "
                         "set num_replicas (or max_replicas) instead")
    return engine_config


def build_application(config: ServerConfig, options: RayServeOptions):
    """The two deployments, bound: a ``ray.serve.Application`` for ``serve.run``."""
    from ray import serve
    from ray.serve.config import RequestRouterConfig

    from aioinfer.ray.replica import EngineReplica
    from aioinfer.ray.routing import PrefixAffinityRouter

    engine_config = engine_config_of(config)
    engine = serve.deployment(EngineReplica, name=ENGINE_DEPLOYMENT).options(
        **options.engine_deployment_options(engine_config.device, engine_config.parallel.tensor_parallel_size,
                                            config.shutdown_grace),
        request_router_config=RequestRouterConfig(
            request_router_class=PrefixAffinityRouter,
            request_router_kwargs={"imbalance_threshold": options.routing_imbalance_threshold}))
    ingress = serve.deployment(serve.ingress()(OpenAIIngress), name=INGRESS_DEPLOYMENT).options(
        **options.ingress_deployment_options())
    # Ray's proxy listens, not the ingress: no listen backlog of its own to raise (listen_backlog.py).
    return ingress.bind(engine.bind(config.engine_arguments()), dataclasses.replace(config, listen_backlog=0),
                        options.route_prefix_blocks)


class OpenAIIngress:
    """The ingress deployment's class (``build_application`` wraps it with ``serve.ingress()``): Ray
    Serve calls ``__serve_build_asgi_app__`` on the replica once it is built, and runs the app's ASGI
    lifespan, where the server's ``ServerState`` starts the ``RayEngine`` (and stops it on shutdown)."""

    def __init__(self, engine_handle, config: ServerConfig, route_prefix_blocks: int = 4) -> None:
        self._engine_handle = engine_handle
        self._config = config
        self._route_prefix_blocks = route_prefix_blocks

    def __serve_build_asgi_app__(self):
        from aioinfer.entrypoints.openai.api_server import create_app
        from aioinfer.ray.client import RayEngine
        from aioinfer.server_config import configure_server_logging

        configure_server_logging()  # "engine ready" and errors reach the replica's log, as hypercorn's app does
        handle, prefix_blocks = self._engine_handle, self._route_prefix_blocks

        def engine_factory(observers=(), **engine_arguments):
            return RayEngine(handle, observers=observers, prefix_blocks=prefix_blocks, **engine_arguments)

        return create_app(self._config, engine_factory=engine_factory)


def run_with_ray(config: ServerConfig, options: RayServeOptions, host: str, port: int) -> None:
    """``serve --ray``: start Ray (or join ``ray_address``), deploy, and serve on ``host:port`` until
    SIGINT or SIGTERM (also while deploying); then the application is taken down, letting open
    requests finish within ``shutdown_grace`` seconds. A second signal is ignored."""
    if options.ray_high_throughput and options.ray_address is None:  # before Ray reads them (options.py)
        for name in HIGH_THROUGHPUT_ENV:
            os.environ.setdefault(name, "1")
    import ray
    from ray import serve

    app = build_application(config, options)
    ray.init(address=options.ray_address, namespace="serve", include_dashboard=False)
    if options.ray_address is None:  # our own one-machine cluster: it will not grow to fit
        engine_config = engine_config_of(config)
        problem = options.unschedulable(engine_config.device, engine_config.parallel.tensor_parallel_size,
                                        ray.cluster_resources())
        if problem is not None:
            ray.shutdown()
            raise ValueError(problem)
    http: dict[str, Any] = {"host": host, "port": port}
    if config.ssl_certfile:
        http.update(ssl_certfile=config.ssl_certfile, ssl_keyfile=config.ssl_keyfile or config.ssl_certfile,
                    ssl_ca_certs=config.ssl_ca_certs)

    def on_signal(signum, frame) -> None:
        for other in _SIGNALS:
            signal.signal(other, signal.SIG_IGN)
        raise _Stop(signal.Signals(signum).name)

    for signum in _SIGNALS:  # after ray.init, which installs a SIGTERM handler of its own
        signal.signal(signum, on_signal)
    try:
        serve.start(http_options=http)
        serve.run(app, name=APP_NAME, route_prefix="/")
        logger.info("serving %s on http://%s:%d through Ray Serve", config.model or "the default model", host, port)
        while True:
            time.sleep(3600)
    except _Stop as stop:
        logger.info("%s: stopping (open requests may finish within %g s)", stop, config.shutdown_grace)
    finally:
        try:
            if options.ray_address is None:
                serve.shutdown()  # our own Ray: Serve and all with it
            else:
                serve.delete(APP_NAME)  # a shared cluster: only this application
        finally:
            ray.shutdown()


_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _Stop(Exception):
    """Raised by ``run_with_ray``'s signal handler, so that a signal also interrupts the deployment."""
