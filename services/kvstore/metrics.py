"""The KV store's Prometheus metrics (names per dashboards/METRICS.md), synced from the core's counters."""

from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge

from .store import BlockStore


class StoreMetrics:
    """`sync(store)` after each call sets gauges and adds what the counters grew by since last time."""

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, ["tier"], registry=registry)

        def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
            return Counter(name, doc, labels, registry=registry)

        self.blocks = gauge("kvmesh_kvstore_blocks", "blocks held per tier")
        self.bytes = gauge("kvmesh_kvstore_bytes", "bytes held per tier")
        self.capacity = gauge("kvmesh_kvstore_capacity_bytes", "byte budget per tier")
        self.evictions = counter("kvmesh_kvstore_evictions", "blocks leaving a tier", ("tier", "reason"))
        self.query_blocks = counter("kvmesh_kvstore_lookup_query_blocks", "blocks asked for by Lookup")
        self.hit_blocks = counter("kvmesh_kvstore_lookup_hit_blocks", "blocks found by Lookup")
        self.get_bytes = counter("kvmesh_kvstore_get_bytes", "bytes served by Get")
        self.put_bytes = counter("kvmesh_kvstore_put_bytes", "bytes stored by Put")
        self.rejected = counter("kvmesh_kvstore_rejected", "bad frames refused", ("reason",))
        self._seen: dict[str, int] = {}

    def sync(self, store: BlockStore) -> None:
        for tier in store.stats():
            self.blocks.labels(tier.name).set(tier.blocks)
            self.bytes.labels(tier.name).set(tier.bytes)
            self.capacity.labels(tier.name).set(tier.capacity_bytes)
        c = store.counters
        self._add("query", c.lookup_query_blocks, self.query_blocks)
        self._add("hit", c.lookup_hit_blocks, self.hit_blocks)
        self._add("get_bytes", c.get_bytes, self.get_bytes)
        self._add("put_bytes", c.put_bytes, self.put_bytes)
        for (tier, reason), count in list(c.evictions.items()):
            self._add(f"evict/{tier}/{reason}", count, self.evictions.labels(tier, reason))

    def _add(self, name: str, total: int, counter: Counter) -> None:
        delta = total - self._seen.get(name, 0)
        if delta > 0:
            counter.inc(delta)
        self._seen[name] = total
