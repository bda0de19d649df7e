"""The scheduler's metric mirrors."""

from prometheus_client import CollectorRegistry, Gauge

from kvmesh.scheduler.metrics import LabeledCounts


def _series(registry: CollectorRegistry) -> dict[tuple[str, str], float]:
    return {(s.labels["role"], s.labels["pool"]): s.value for m in registry.collect() for s in m.samples}


def test_labeled_counts_set_changed_series_and_drop_vanished_ones():
    registry = CollectorRegistry()
    gauge = Gauge("workers", "live workers", ["role", "pool"], registry=registry)
    mirror = LabeledCounts(gauge)
    mirror.update({("decode", "production"): 2, ("prefill", "production"): 1})
    assert _series(registry) == {("decode", "production"): 2, ("prefill", "production"): 1}
    mirror.update({("decode", "production"): 3, ("decode", "canary"): 1})
    assert _series(registry) == {("decode", "production"): 3, ("decode", "canary"): 1}
    mirror.update({})
    assert _series(registry) == {}


def test_labeled_counts_leave_an_unchanged_series_alone():
    registry = CollectorRegistry()
    gauge = Gauge("workers", "live workers", ["role", "pool"], registry=registry)
    mirror = LabeledCounts(gauge)
    mirror.update({("decode", "production"): 1})
    child = gauge.labels("decode", "production")
    mirror.update({("decode", "production"): 1, ("prefill", "production"): 1})
    assert gauge.labels("decode", "production") is child  # not cleared and made again
