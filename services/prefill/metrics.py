"""Prefill worker metrics (names per dashboards/METRICS.md)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from kvmesh.runtime.metrics import LATENCY_BUCKETS

REQUESTS = Counter("kvmesh_prefill_requests", "Prefill calls", ["status"])
COMPUTED_TOKENS = Counter("kvmesh_prefill_computed_tokens", "prompt tokens computed")
CACHED_TOKENS = Counter("kvmesh_prefill_cached_tokens", "prompt tokens taken from a cache", ["source"])
KV_BLOCKS_PUSHED = Counter("kvmesh_prefill_kv_blocks_pushed", "KV blocks pushed", ["encoding"])
KV_BYTES_PUSHED = Counter("kvmesh_prefill_kv_bytes_pushed", "KV bytes pushed (on the wire)", ["encoding"])
SECONDS = Histogram("kvmesh_prefill_seconds", "Prefill call duration", buckets=LATENCY_BUCKETS)
KV_BLOCKS_USED = Gauge("kvmesh_prefill_kv_blocks_used", "paged KV cache blocks in use")
KV_BLOCKS_FREE = Gauge("kvmesh_prefill_kv_blocks_free", "free paged KV cache blocks")
