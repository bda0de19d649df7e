"""The gateway's Prometheus metrics (names from dashboards/METRICS.md), in their own registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from kvmesh.runtime.metrics import LATENCY_BUCKETS

# Per-token gaps are short; a finer low end than the request-latency buckets.
TOKEN_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.15, 0.3, 0.6, 1.2, 2.5, 5.0)


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter("kvmesh_gateway_requests", "finished HTTP requests", ["route", "status"], registry=r)
        self.inflight = Gauge("kvmesh_gateway_inflight_requests", "requests being served", registry=r)
        self.ttft = Histogram("kvmesh_gateway_ttft_seconds", "time to first token", buckets=LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram(
            "kvmesh_gateway_tpot_seconds", "mean time per output token after the first", buckets=TOKEN_BUCKETS, registry=r
        )
        self.inter_token = Histogram(
            "kvmesh_gateway_inter_token_seconds", "time between streamed token chunks", buckets=TOKEN_BUCKETS, registry=r
        )
        self.e2e = Histogram("kvmesh_gateway_e2e_seconds", "whole request", buckets=LATENCY_BUCKETS, registry=r)
        self.prompt_tokens = Counter("kvmesh_gateway_prompt_tokens", "prompt tokens", registry=r)
        self.completion_tokens = Counter("kvmesh_gateway_completion_tokens", "completion tokens", registry=r)
        self.mirror_published = Counter("kvmesh_gateway_mirror_published", "requests mirrored to the canary", registry=r)
        self.mirror_dropped = Counter(
            "kvmesh_gateway_mirror_dropped", "mirror records dropped (buffer full / NATS down)", registry=r
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
