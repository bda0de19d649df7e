"""The gateway's Prometheus metrics (names from dashboards/METRICS.md), in their own registry."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import HistogramMetricFamily

from kvmesh.runtime.metrics import LATENCY_BUCKETS

# Per-token gaps are short; a finer low end than the request-latency buckets.
TOKEN_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.15, 0.3, 0.6, 1.2, 2.5, 5.0)


class LoopHistogram:
    """A histogram observed from the event loop only: no lock, one bisect and two adds per
    observation (prometheus_client's Histogram takes a lock per bucket and per sum, several
    microseconds: it was a tenth of the gateway's cost per streamed chunk). Same exposition."""

    def __init__(self, name: str, documentation: str, buckets: Sequence[float], registry: CollectorRegistry) -> None:
        self.name = name
        self.documentation = documentation
        self._bounds = [float(b) for b in buckets]
        self._counts = [0] * (len(self._bounds) + 1)  # the last one is +Inf
        self._sum = 0.0
        registry.register(self)

    def observe(self, value: float) -> None:
        self._counts[bisect_left(self._bounds, value)] += 1
        self._sum += value

    def collect(self) -> Iterator[HistogramMetricFamily]:
        cumulative, running = [], 0
        for bound, count in zip([*map(str, self._bounds), "+Inf"], self._counts):
            running += count
            cumulative.append((bound, running))
        yield HistogramMetricFamily(self.name, self.documentation, buckets=cumulative, sum_value=self._sum)

    def describe(self) -> list:
        return []


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
        self.inter_token = LoopHistogram(
            "kvmesh_gateway_inter_token_seconds", "time between streamed token chunks", buckets=TOKEN_BUCKETS, registry=r
        )
        self.e2e = Histogram("kvmesh_gateway_e2e_seconds", "whole request", buckets=LATENCY_BUCKETS, registry=r)
        self.loop_lag = LoopHistogram(
            "kvmesh_gateway_event_loop_lag_seconds", "how late the event loop woke for a timer due every 0.1 s "
            "(what ready work waits: requests, SSE writes)", buckets=TOKEN_BUCKETS, registry=r
        )
        self.prompt_tokens = Counter("kvmesh_gateway_prompt_tokens", "prompt tokens", registry=r)
        self.completion_tokens = Counter("kvmesh_gateway_completion_tokens", "completion tokens", registry=r)
        self.mirror_published = Counter("kvmesh_gateway_mirror_published", "requests mirrored to the canary", registry=r)
        self.mirror_dropped = Counter(
            "kvmesh_gateway_mirror_dropped", "mirror records dropped (buffer full / NATS down)", registry=r
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
