"""Prometheus metrics: an ``EngineObserver`` writing into one ``CollectorRegistry`` per app.

Names follow vLLM where vLLM has the metric (so existing dashboards work); the rest are
``aioinfer:``-prefixed. docs/server.md lists every series. Observers run on the event loop and
must never raise, so every callback swallows (and logs) its own failures.
"""

from __future__ import annotations

import logging
from typing import Optional

import bisect
import threading
from typing import Iterable, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import HistogramMetricFamily, Metric

from aioinfer.async_engine.stats import RequestStats, StepStats

logger = logging.getLogger(__name__)

# vLLM's buckets, so that quantiles are comparable across the two servers.
_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
_ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0)
_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                    240.0, 480.0, 960.0, 1920.0, 7680.0)
# vLLM's request_time_per_output_token_seconds (a request's mean gap) uses the inter-token buckets.
_REQUEST_TPOT_BUCKETS = _ITL_BUCKETS
# prometheus-fastapi-instrumentator's default low-resolution buckets for http_request_duration_seconds.
_HTTP_DURATION_BUCKETS = (0.1, 0.5, 1.0)
# Routes vLLM leaves out of its HTTP series (probes and the scrape itself): aioinfer's ones of them.
_HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "CONNECT", "TRACE"})
_HTTP_EXCLUDED = frozenset({"/metrics", "/health", "/ready", "/version"})
_TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
# KV swaps: one block of a 7b model is ~1 MiB, a long request's whole KV a few GiB; PCIe 5 is ~50 GB/s.
_SWAP_BYTES_BUCKETS = tuple(float(2**i) for i in range(16, 35, 2))  # 64 KiB .. 16 GiB
_SWAP_SECONDS_BUCKETS = (1e-5, 1e-4, 5e-4, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_SWAP_GBPS_BUCKETS = (0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 20.0, 25.0, 30.0, 40.0, 50.0, 75.0)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class PrometheusMetrics:
    """All series of one server. ``observe_http`` is called by the app; the rest by the engine.

    Engine-level series carry vLLM's ``engine`` label, one value per data-parallel replica ("0"
    without data parallelism): sum over it for the server's figure (kv_cache_usage_perc: average).
    Series about the server as a whole (HTTP, admission refusals) have no ``engine`` label.
    """

    def __init__(self, model_name: str, registry: Optional[CollectorRegistry] = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self.model_name = model_name
        r, labels = self.registry, ["model_name", "engine"]

        def hist(name: str, doc: str, buckets) -> Histogram:
            return Histogram(name, doc, labels, buckets=buckets, registry=r)

        self.running = Gauge("vllm:num_requests_running", "Requests in the running batch.", labels, registry=r)
        self.waiting = Gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled.", labels, registry=r)
        self.waiting_by_reason = Gauge(
            "vllm:num_requests_waiting_by_reason", "Waiting requests by reason: 'capacity' waits for batch or KV "
            "capacity; 'deferred' would wait on a transient constraint (LoRA budget, KV transfer), which this "
            "scheduler never has, so it reads 0. The reasons sum to vllm:num_requests_waiting.",
            labels + ["reason"], registry=r)
        self.kv_usage = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage: 1 means 100 percent.", labels, registry=r)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prompt tokens whose prefill completed (counted "
                                     "at the request's first token, as vLLM does).", labels, registry=r)
        self.generation_tokens = Counter("vllm:generation_tokens", "Generated tokens.", labels, registry=r)
        self.preemptions = Counter("vllm:num_preemptions", "Requests preempted (KV recomputed or swapped out).", labels,
                                   registry=r)
        self.prefix_cache_queries = Counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix "
                                            "cache (at first admission).", labels, registry=r)
        self.prefix_cache_hits = Counter("vllm:prefix_cache_hits", "Prompt tokens served from the prefix cache.",
                                         labels, registry=r)
        self.prompt_tokens_by_source = Counter(
            "vllm:prompt_tokens_by_source", "Prompt tokens by where their KV came from: local_compute (prefilled), "
            "local_cache_hit (the prefix cache), external_kv_transfer (always 0: no KV connector here). Counted "
            "when the request ends, for requests that got a first token; sums to vllm:prompt_tokens once idle.",
            labels + ["source"], registry=r)
        self.external_prefix_cache_queries = Counter(
            "vllm:external_prefix_cache_queries", "Prompt tokens looked up in an external KV cache (KV connector). "
            "Always 0: aioinfer has no external KV cache.", labels, registry=r)
        self.external_prefix_cache_hits = Counter(
            "vllm:external_prefix_cache_hits", "Prompt tokens served from an external KV cache (KV connector). "
            "Always 0: aioinfer has no external KV cache.", labels, registry=r)
        self.mm_cache_queries = Counter("vllm:mm_cache_queries", "Multimodal cache lookups. Always 0: aioinfer "
                                        "serves text only and has no multimodal cache.", labels, registry=r)
        self.mm_cache_hits = Counter("vllm:mm_cache_hits", "Multimodal cache hits. Always 0: aioinfer serves "
                                     "text only and has no multimodal cache.", labels, registry=r)
        self.spec_drafts = Counter("vllm:spec_decode_num_drafts", "Speculative decoding: verification rounds "
                                   "(a request's drafts checked in one step).", labels, registry=r)
        self.spec_draft_tokens = Counter("vllm:spec_decode_num_draft_tokens", "Speculative decoding: draft "
                                         "tokens verified.", labels, registry=r)
        self.spec_accepted_tokens = Counter("vllm:spec_decode_num_accepted_tokens", "Speculative decoding: "
                                            "draft tokens accepted.", labels, registry=r)
        self.spec_accepted_per_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos", "Speculative "
                                             "decoding: drafts accepted at each position of a round (0 first).",
                                             labels + ["position"], registry=r)
        self.success = Counter("vllm:request_success", "Requests that ended, by finish reason (stop, length, "
                               "abort; error: the engine failed the request).", labels + ["finished_reason"],
                               registry=r)
        self.ttft = hist("vllm:time_to_first_token_seconds", "Time to first token.", _TTFT_BUCKETS)
        # A request's gaps arrive together when it ends, one per token: a bulk histogram takes them in
        # one call (prometheus_client's observe costs ~1.5 us each, on the event loop).
        self.itl = BulkHistogram("vllm:inter_token_latency_seconds", "Time between consecutive token deliveries.",
                                 labels, _ITL_BUCKETS, registry=r)
        self.e2e = hist("vllm:e2e_request_latency_seconds", "Arrival to end of a request.", _LATENCY_BUCKETS)
        self.queue_time = hist("vllm:request_queue_time_seconds", "Arrival to first scheduled step.",
                               _LATENCY_BUCKETS)
        self.prefill_time = hist("vllm:request_prefill_time_seconds", "First scheduled step to first token "
                                 "(PREFILL phase), of requests that got a first token.", _LATENCY_BUCKETS)
        self.decode_time = hist("vllm:request_decode_time_seconds", "First token to last token (DECODE phase), "
                                "of requests that got a first token.", _LATENCY_BUCKETS)
        self.request_tpot = hist("vllm:request_time_per_output_token_seconds", "A request's mean time per output "
                                 "token after the first: decode time / (output tokens - 1), 0 for one token.",
                                 _REQUEST_TPOT_BUCKETS)
        self.request_prompt_tokens = hist("vllm:request_prompt_tokens", "Prompt length of finished requests.",
                                          _TOKEN_BUCKETS)
        self.request_generation_tokens = hist("vllm:request_generation_tokens",
                                              "Output length of finished requests.", _TOKEN_BUCKETS)
        self.request_max_generation_tokens = hist(
            "vllm:request_max_num_generation_tokens", "Output length of finished requests: vLLM's maximum over a "
            "request's n sequences; each choice of n > 1 is its own engine request here, so this equals "
            "vllm:request_generation_tokens.", _TOKEN_BUCKETS)
        self.iteration_tokens = hist("vllm:iteration_tokens_total", "Tokens computed per engine step.",
                                     _TOKEN_BUCKETS)
        self.step_requests = hist("aioinfer:step_batched_requests", "Requests computed together in one step.",
                                  _BATCH_BUCKETS)
        self.step_time = hist("aioinfer:step_duration_seconds", "Wall time of one engine step.", _TTFT_BUCKETS)
        self.aborted = Counter("aioinfer:requests_aborted", "Requests aborted, by cause.",
                               labels + ["cause"], registry=r)
        self.failed = Counter("aioinfer:requests_failed", "Requests that ended with an engine error.", labels,
                              registry=r)
        self.routed = Counter("aioinfer:router_requests", "Requests a data-parallel router sent to each replica, "
                              "by reason (prefix affinity or least load).", labels + ["route"], registry=r)
        swap_labels = labels + ["direction"]  # "out" (device -> host) | "in" (host -> device)
        self.swap_bytes = Histogram("aioinfer:kv_swap_bytes", "Bytes moved by one KV swap copy.", swap_labels,
                                    buckets=_SWAP_BYTES_BUCKETS, registry=r)
        self.swap_seconds = Histogram("aioinfer:kv_swap_seconds", "Duration of one KV swap copy (CUDA events).",
                                      swap_labels, buckets=_SWAP_SECONDS_BUCKETS, registry=r)
        self.swap_bandwidth = Histogram("aioinfer:kv_swap_bandwidth_gbps", "Bandwidth of one KV swap copy, GB/s.",
                                        swap_labels, buckets=_SWAP_GBPS_BUCKETS, registry=r)
        self.rejected = Counter("aioinfer:requests_rejected", "Requests refused at admission, by reason.",
                                ["model_name", "reason"], registry=r)
        self.http = Counter("aioinfer:http_requests", "HTTP requests by route and status code.",
                            ["model_name", "route", "status"], registry=r)
        # prometheus-fastapi-instrumentator's series, as vLLM's server exposes them: status grouped into
        # classes ("2xx"), handler the route template ("none" when no route matched), probes left out.
        self.http_requests = Counter("http_requests", "Total number of requests by method, status and handler.",
                                     ["method", "status", "handler"], registry=r)
        self.http_duration = Histogram("http_request_duration_seconds", "Latency with only few buckets by "
                                       "handler (request start to the response's headers).",
                                       ["method", "handler"], buckets=_HTTP_DURATION_BUCKETS, registry=r)
        # vLLM's older names of two series, kept by vLLM for old dashboards: re-exposed at scrape time.
        _Alias(self.kv_usage, "vllm:gpu_cache_usage_perc", "GPU KV-cache usage: 1 means 100 percent. "
               "DEPRECATED: vllm:kv_cache_usage_perc under its older name.", registry=r)
        _Alias(self.itl, "vllm:time_per_output_token_seconds", "Time between consecutive token deliveries. "
               "DEPRECATED: vllm:inter_token_latency_seconds under its older name.", registry=r)
        self._engines: dict[int, _EngineSeries] = {}
        self.engine(0)  # engine "0" exists from the start, replicas beyond it from their first record
        # vLLM's vllm:cache_config_info (value 1, the cache's settings as labels), made at the first
        # set_cache_config: its label names are the engine's (CacheConfig.metrics_info), known once it loaded
        self.cache_config_info: Optional[Gauge] = None
        self._cache_label_names: tuple[str, ...] = ()
        self._cache_info: dict[int, dict[str, str]] = {}

    def engine(self, index: int) -> "_EngineSeries":
        """The series of one engine (replica), bound to its labels once."""
        series = self._engines.get(index)
        if series is None:
            series = self._engines[index] = _EngineSeries(self, str(index))
        return series

    # ---------------------------------------------------------------- EngineObserver

    def on_step(self, stats: StepStats) -> None:
        try:
            e = self.engine(stats.engine_index)
            e.running.set(stats.num_running)
            e.waiting.set(stats.num_waiting)
            e.waiting_capacity.set(stats.num_waiting)
            e.kv_usage.set(stats.kv_usage)
            e.generation_tokens.inc(stats.num_generation_tokens)
            if stats.num_prefilled_prompt_tokens:
                e.prompt_tokens.inc(stats.num_prefilled_prompt_tokens)
            if stats.num_preempted:
                e.preemptions.inc(stats.num_preempted)
            if stats.num_prefix_cache_queries:
                e.prefix_cache_queries.inc(stats.num_prefix_cache_queries)
                e.prefix_cache_hits.inc(stats.num_prefix_cache_hits)
            if stats.num_batched_requests:
                # vLLM's sum: prompt tokens (once, at their first token) + tokens generated, so that a
                # request counts P + G over its steps (the computed tokens would be P + G - 1).
                e.iteration_tokens.observe(stats.num_prefilled_prompt_tokens + stats.num_generation_tokens)
                e.step_requests.observe(stats.num_batched_requests)
                e.step_time.observe(stats.step_time)
            if stats.num_spec_drafts:
                e.spec_drafts.inc(stats.num_spec_drafts)
                e.spec_draft_tokens.inc(stats.num_spec_draft_tokens)
                e.spec_accepted_tokens.inc(stats.num_spec_accepted_tokens)
                for position, count in enumerate(stats.spec_accepted_per_position):
                    if count:
                        self.spec_accepted_per_pos.labels(self.model_name, e.label, str(position)).inc(count)
            for swap in stats.swaps:
                self.swap_bytes.labels(self.model_name, e.label, swap.direction).observe(swap.num_bytes)
                self.swap_seconds.labels(self.model_name, e.label, swap.direction).observe(swap.seconds)
                self.swap_bandwidth.labels(self.model_name, e.label, swap.direction).observe(swap.gb_per_s)
        except Exception:  # noqa: BLE001 - observers must not raise
            logger.exception("metrics: on_step failed")

    def on_request_done(self, stats: RequestStats) -> None:
        try:
            m, e = self.model_name, self.engine(stats.engine_index)
            if stats.queue_time is not None:
                e.queue_time.observe(stats.queue_time)
            if stats.ttft is not None:
                e.ttft.observe(stats.ttft)
                if stats.queue_time is not None:
                    e.prefill_time.observe(max(0.0, stats.ttft - stats.queue_time))
                cached = min(stats.num_cached_tokens, stats.num_prompt_tokens)
                e.prompt_local_compute.inc(stats.num_prompt_tokens - cached)
                if cached:
                    e.prompt_local_cache_hit.inc(cached)
            if stats.decode_time is not None:
                e.decode_time.observe(stats.decode_time)
                gaps = stats.num_output_tokens - 1
                e.request_tpot.observe(stats.decode_time / gaps if gaps > 0 else 0.0)
            e.itl.observe_many(stats.inter_token_latencies)
            e.e2e.observe(stats.e2e_latency)
            if stats.status == "error":
                e.failed.inc()
                self.success.labels(m, e.label, "error").inc()
                return
            self.success.labels(m, e.label, stats.finish_reason or "abort").inc()
            e.request_prompt_tokens.observe(stats.num_prompt_tokens)
            e.request_generation_tokens.observe(stats.num_output_tokens)
            e.request_max_generation_tokens.observe(stats.num_output_tokens)
            if stats.status == "aborted":
                self.aborted.labels(m, e.label, stats.abort_cause or "unknown").inc()
        except Exception:  # noqa: BLE001
            logger.exception("metrics: on_request_done failed")

    def on_rejected(self, reason: str) -> None:
        try:
            self.rejected.labels(self.model_name, reason).inc()
        except Exception:  # noqa: BLE001
            logger.exception("metrics: on_rejected failed")

    def on_routed(self, engine_index: int, by_affinity: bool) -> None:
        try:
            self.routed.labels(self.model_name, self.engine(engine_index).label,
                               "prefix_affinity" if by_affinity else "least_loaded").inc()
        except Exception:  # noqa: BLE001
            logger.exception("metrics: on_routed failed")

    # ---------------------------------------------------------------- server side

    def observe_http(self, route: str, status: int, method: str = "GET", duration: Optional[float] = None) -> None:
        """One HTTP response: ``route`` is the matched rule ("unmatched" if none), ``duration`` in seconds."""
        try:
            self.http.labels(self.model_name, route, str(status)).inc()
            if route in _HTTP_EXCLUDED:
                return
            handler = "none" if route == "unmatched" else route
            # The method is the client's string: a label per made-up method would grow without bound.
            method = method if method in _HTTP_METHODS else "other"
            self.http_requests.labels(method, f"{status // 100}xx", handler).inc()
            if duration is not None:
                self.http_duration.labels(method, handler).observe(duration)
        except Exception:  # noqa: BLE001
            logger.exception("metrics: observe_http failed")

    def set_cache_config(self, engine_index: int, info: dict[str, str]) -> None:
        """vLLM's ``vllm:cache_config_info{engine, block_size, cache_dtype, ...} 1`` for one engine."""
        try:
            if self._cache_info.get(engine_index) == info:
                return
            if self.cache_config_info is None:
                self._cache_label_names = tuple(info)
                self.cache_config_info = Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                                               [*self._cache_label_names, "engine"], registry=self.registry)
            previous = self._cache_info.get(engine_index)
            if previous is not None:  # remove() takes the values in the gauge's label order
                self.cache_config_info.remove(*(previous[name] for name in self._cache_label_names),
                                              str(engine_index))
            self.cache_config_info.labels(**info, engine=str(engine_index)).set(1)
            self._cache_info[engine_index] = dict(info)
        except Exception:  # noqa: BLE001
            logger.exception("metrics: set_cache_config failed")

    def refresh(self, engine_stats: Optional[dict]) -> None:
        """Gauges from the engine's snapshot at scrape time (no step runs while idle)."""
        if not engine_stats:
            return
        for index, stats in enumerate(engine_stats.get("replicas") or [engine_stats]):
            if stats.get("cache_config"):
                self.set_cache_config(index, stats["cache_config"])
            e = self.engine(index)
            e.running.set(stats.get("num_running", 0))
            e.waiting.set(stats.get("num_waiting", 0))
            e.waiting_capacity.set(stats.get("num_waiting", 0))
            e.kv_usage.set(stats.get("kv_usage", 0.0))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _EngineSeries:
    """One engine's children of the engine-level series (label lookups once, not per step)."""

    _BOUND = ("running", "waiting", "kv_usage", "prompt_tokens", "generation_tokens", "preemptions",
              "prefix_cache_queries", "prefix_cache_hits", "ttft", "itl",
              "e2e", "queue_time", "request_prompt_tokens", "request_generation_tokens", "iteration_tokens",
              "step_requests", "step_time", "failed", "spec_drafts", "spec_draft_tokens", "spec_accepted_tokens",
              "prefill_time", "decode_time", "request_tpot", "request_max_generation_tokens",
              "external_prefix_cache_queries", "external_prefix_cache_hits", "mm_cache_queries", "mm_cache_hits")

    def __init__(self, metrics: PrometheusMetrics, label: str) -> None:
        self.label = label
        m = metrics.model_name
        for name in self._BOUND:
            setattr(self, name, getattr(metrics, name).labels(m, label))
        # Labelled children bound once, so that every value is exposed (at 0) from the start.
        self.waiting_capacity = metrics.waiting_by_reason.labels(m, label, "capacity")
        metrics.waiting_by_reason.labels(m, label, "deferred").set(0)
        self.prompt_local_compute = metrics.prompt_tokens_by_source.labels(m, label, "local_compute")
        self.prompt_local_cache_hit = metrics.prompt_tokens_by_source.labels(m, label, "local_cache_hit")
        metrics.prompt_tokens_by_source.labels(m, label, "external_kv_transfer")


class _Alias:
    """Re-exposes another collector's samples under another family name, computed at scrape time."""

    def __init__(self, source, name: str, documentation: str, registry: CollectorRegistry) -> None:
        self.source, self.name, self.documentation = source, name, documentation
        registry.register(self)

    def describe(self) -> list:
        return []  # the name is checked by nobody else: it is this collector's alone

    def collect(self) -> Iterable[Metric]:
        for family in self.source.collect():
            alias = Metric(self.name, self.documentation, family.type)
            alias.samples = [s._replace(name=self.name + s.name[len(family.name):]) for s in family.samples]
            yield alias


class BulkHistogram:
    """A labelled Prometheus histogram whose children take many observations in one call.

    Exposed exactly as a ``prometheus_client.Histogram`` (``_bucket``, ``_sum``, ``_count``); the
    counts live in plain lists, filled by ``bisect`` in C, under one lock per call, not per value.
    """

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], buckets: Sequence[float],
                 registry: CollectorRegistry) -> None:
        self.name, self.documentation, self.labelnames = name, documentation, tuple(labelnames)
        self.bounds = tuple(float(b) for b in buckets)  # +Inf is the last, implicit bucket
        self._children: dict[tuple[str, ...], _BulkChild] = {}
        self._lock = threading.Lock()
        registry.register(self)

    def labels(self, *values: str) -> "_BulkChild":
        key = tuple(str(v) for v in values)
        with self._lock:
            child = self._children.get(key)
            if child is None:
                child = self._children[key] = _BulkChild(self.bounds)
            return child

    def describe(self) -> list:
        return [HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)]

    def collect(self) -> Iterable[HistogramMetricFamily]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        with self._lock:
            children = list(self._children.items())
        for key, child in children:
            counts, total = child.snapshot()
            cumulative, buckets = 0, []
            for bound, count in zip((*self.bounds, float("inf")), counts):
                cumulative += count
                buckets.append(("+Inf" if bound == float("inf") else _float_str(bound), cumulative))
            family.add_metric(list(key), buckets, total)
        yield family


class _BulkChild:
    __slots__ = ("_bounds", "_counts", "_sum", "_lock")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self._counts = [0] * (len(bounds) + 1)
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe(self, value: float) -> None:
        self.observe_many((value,))

    def observe_many(self, values: Iterable[float]) -> None:
        bounds, counts, locate = self._bounds, self._counts, bisect.bisect_left
        with self._lock:
            for value in values:
                counts[locate(bounds, value)] += 1  # le semantics: a value equal to a bound counts in it
                self._sum += value

    def snapshot(self) -> tuple[list[int], float]:
        with self._lock:
            return list(self._counts), self._sum


def _float_str(value: float) -> str:
    from prometheus_client.utils import floatToGoString

    return floatToGoString(value)
