"""The scheduler's Prometheus metrics (names per dashboards/METRICS.md)."""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import Counter, Gauge, Histogram

ROUTE_DECISIONS = Counter(
    "kvmesh_scheduler_route_decisions_total", "routing decisions", ["policy", "prefill"]
)
ROUTE_OVERLAP_BLOCKS = Histogram(
    "kvmesh_scheduler_route_overlap_blocks",
    "cached blocks on the chosen decode worker",
    ["policy"],
    buckets=(0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096),
)
QUEUE_DEPTH = Gauge("kvmesh_scheduler_queue_depth", "requests waiting for admission")
ADMISSION_WAIT = Histogram(
    "kvmesh_scheduler_admission_wait_seconds",
    "time a routed request waited for an admission slot, by priority class",
    ["priority"],
    buckets=(0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
ROUTE_STREAM_FRAMES = Counter(
    "kvmesh_scheduler_route_stream_frames_total",
    "frames read on Routes streams by kind: route, complete, or batch (several routes and completes in one)",
    ["kind"],
)
REJECTED = Counter("kvmesh_scheduler_rejected_total", "requests refused (queue full -> 429)")
WORKERS = Gauge("kvmesh_scheduler_workers", "live workers", ["role", "pool"])
KV_EVENTS_APPLIED = Counter("kvmesh_scheduler_kv_events_applied_total", "KV event batches applied to the index")
KV_EVENT_GAPS = Counter("kvmesh_scheduler_kv_event_gaps_total", "sequence gaps detected (repaired by replay/dump)")
REPLICAS = Gauge("kvmesh_scheduler_replicas", "live scheduler replicas this one sees (itself included)")
INDEX_BLOCKS = Gauge("kvmesh_scheduler_index_blocks", "block entries in the global index")
ASSIGNMENTS = Gauge("kvmesh_scheduler_assignments", "routed requests not completed yet (registry)")
ADMITTED = Gauge("kvmesh_scheduler_admitted", "requests holding an admission slot")


def priority_class(priority: int) -> str:
    """A bounded label for a request priority: high (< 0), normal (0), low (> 0)."""
    return "high" if priority < 0 else "low" if priority > 0 else "normal"


class LabeledCounts:
    """Mirrors {label values: count} into a labeled Gauge, touching only the series that changed.

    NOTE: `refresh` runs on every heartbeat and sweep (~9 times a second on an idle mesh); a
    `clear()` and a fresh `labels()` child per worker each time (prometheus_client validates the
    names and reads the environment for every new child) were ~40% of an idle scheduler's CPU."""

    def __init__(self, gauge: Gauge) -> None:
        self.gauge = gauge
        self._last: dict[tuple[str, ...], int] = {}

    def update(self, counts: Mapping[tuple[str, ...], int]) -> None:
        if counts == self._last:
            return
        for labels in self._last.keys() - counts.keys():
            self.gauge.remove(*labels)
        for labels, n in counts.items():
            if self._last.get(labels) != n:
                self.gauge.labels(*labels).set(n)
        self._last = dict(counts)


WORKER_COUNTS = LabeledCounts(WORKERS)  # NOTE: as WORKERS, one per process


class IndexCounters:
    """Mirrors the index's running totals into the Prometheus counters."""

    def __init__(self) -> None:
        self._applied = 0
        self._gaps = 0

    def update(self, batches_applied: int, gaps: int, entries: int) -> None:
        if batches_applied > self._applied:
            KV_EVENTS_APPLIED.inc(batches_applied - self._applied)
        if gaps > self._gaps:
            KV_EVENT_GAPS.inc(gaps - self._gaps)
        self._applied, self._gaps = max(self._applied, batches_applied), max(self._gaps, gaps)
        INDEX_BLOCKS.set(entries)
