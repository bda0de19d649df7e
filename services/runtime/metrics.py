"""Prometheus metrics: each gRPC service serves its registry over HTTP at /metrics."""

from __future__ import annotations

from prometheus_client import start_http_server

# Buckets for latencies in seconds, from sub-millisecond steps to minute-long requests.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def serve_metrics(host: str, port: int) -> int:
    """Starts the /metrics HTTP server in a daemon thread; returns the bound port."""
    server, _thread = start_http_server(port, addr=host)
    return server.server_port
