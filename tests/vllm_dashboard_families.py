"""Prometheus metric families queried by the "expr" fields of two vLLM Grafana dashboards.

Sources (vllm-project/vllm, read 2026-12-02):
- OVERVIEW: examples/observability/dashboards/grafana/vllm_overview.json
- OLDER: examples/online_serving/prometheus_grafana/grafana.json

Data for tests/server/test_vllm_dashboard_metrics.py: every family is found on /metrics after traffic, with
its type and the label values the dashboards select.
"""

OVERVIEW = {  # family name -> {"type": "counter"|"histogram"|"gauge", "labels": {label: [literal values used, if any]}}
    "http_request_duration_seconds": {"type": "histogram", "labels": {"handler": []}},
    "http_requests": {"type": "counter", "labels": {"handler": [], "status": ["5xx"]}},
    "vllm:e2e_request_latency_seconds": {"type": "histogram", "labels": {}},
    "vllm:external_prefix_cache_hits": {"type": "counter", "labels": {}},
    "vllm:external_prefix_cache_queries": {"type": "counter", "labels": {}},
    "vllm:generation_tokens": {"type": "counter", "labels": {}},
    "vllm:inter_token_latency_seconds": {"type": "histogram", "labels": {}},
    "vllm:iteration_tokens_total": {"type": "histogram", "labels": {}},
    "vllm:kv_cache_usage_perc": {"type": "gauge", "labels": {}},
    "vllm:mm_cache_hits": {"type": "counter", "labels": {}},
    "vllm:mm_cache_queries": {"type": "counter", "labels": {}},
    "vllm:num_preemptions": {"type": "counter", "labels": {}},
    "vllm:num_requests_running": {"type": "gauge", "labels": {}},
    "vllm:num_requests_waiting": {"type": "gauge", "labels": {}},
    "vllm:num_requests_waiting_by_reason": {"type": "gauge", "labels": {"reason": ["capacity", "deferred"]}},
    "vllm:prefix_cache_hits": {"type": "counter", "labels": {}},
    "vllm:prefix_cache_queries": {"type": "counter", "labels": {}},
    "vllm:prompt_tokens": {"type": "counter", "labels": {}},
    "vllm:prompt_tokens_by_source": {
        "type": "counter",
        "labels": {"source": ["external_kv_transfer", "local_cache_hit", "local_compute"]},
    },
    "vllm:request_decode_time_seconds": {"type": "histogram", "labels": {}},
    "vllm:request_generation_tokens": {"type": "histogram", "labels": {}},
    "vllm:request_prefill_time_seconds": {"type": "histogram", "labels": {}},
    "vllm:request_prompt_tokens": {"type": "histogram", "labels": {}},
    "vllm:request_queue_time_seconds": {"type": "histogram", "labels": {}},
    "vllm:request_success": {"type": "counter", "labels": {"finished_reason": ["error"]}},
    "vllm:request_time_per_output_token_seconds": {"type": "histogram", "labels": {}},
    "vllm:time_to_first_token_seconds": {"type": "histogram", "labels": {}},
}

OLDER = {  # family name -> {"type": "counter"|"histogram"|"gauge", "labels": {label: [literal values used, if any]}}
    "vllm:e2e_request_latency_seconds": {"type": "histogram", "labels": {}},
    "vllm:generation_tokens": {"type": "counter", "labels": {}},
    "vllm:gpu_cache_usage_perc": {"type": "gauge", "labels": {}},
    "vllm:num_requests_running": {"type": "gauge", "labels": {}},
    "vllm:num_requests_waiting": {"type": "gauge", "labels": {}},
    "vllm:prompt_tokens": {"type": "counter", "labels": {}},
    "vllm:request_decode_time_seconds": {"type": "histogram", "labels": {}},
    "vllm:request_generation_tokens": {"type": "histogram", "labels": {}},
    "vllm:request_max_num_generation_tokens": {"type": "histogram", "labels": {}},
    "vllm:request_prefill_time_seconds": {"type": "histogram", "labels": {}},
    "vllm:request_prompt_tokens": {"type": "histogram", "labels": {}},
    "vllm:request_queue_time_seconds": {"type": "histogram", "labels": {}},
    "vllm:request_success": {"type": "counter", "labels": {"finished_reason": []}},
    "vllm:time_per_output_token_seconds": {"type": "histogram", "labels": {}},
    "vllm:time_to_first_token_seconds": {"type": "histogram", "labels": {}},
}
