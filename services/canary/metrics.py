"""Canary metrics (dashboards/METRICS.md), read from the current report at scrape time."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .rolloutdriver import RolloutDriver
from .state import Report


class CanaryCollector(Collector):
    """Exports verdict, comparison, latency deltas and mirror intake counters of `report()`."""

    def __init__(self, report: Callable[[], Report], rollout: RolloutDriver | None = None) -> None:
        self._report = report
        self._rollout = rollout

    def collect(self) -> Iterator[Metric]:
        r = self._report()
        s = r.summary
        yield GaugeMetricFamily("kvmesh_canary_verdict", "0 collecting, 1 pass, 2 fail", value=r.decision.verdict.metric_value)
        yield GaugeMetricFamily("kvmesh_canary_samples", "compared requests", value=s.samples)
        yield GaugeMetricFamily("kvmesh_canary_token_agreement", "mean token agreement with production", value=s.token_agreement)
        yield GaugeMetricFamily("kvmesh_canary_exact_match_rate", "share of identical outputs", value=s.exact_match_rate)
        yield GaugeMetricFamily(
            "kvmesh_canary_noise_floor_agreement", "token agreement of production with itself", value=s.noise_floor_agreement
        )
        for name, delta in (("ttft", s.ttft), ("tpot", s.tpot)):
            family = GaugeMetricFamily(
                f"kvmesh_canary_{name}_delta_seconds", f"candidate minus production {name.upper()}", labels=["quantile"]
            )
            family.add_metric(["0.5"], delta.delta_p50)
            family.add_metric(["0.99"], delta.delta_p99)
            yield family
        yield CounterMetricFamily("kvmesh_canary_mirror_received", "mirrored records received", value=r.received)
        yield CounterMetricFamily("kvmesh_canary_mirror_dropped", "mirrored records dropped (buffer full)", value=r.dropped)
        yield CounterMetricFamily("kvmesh_canary_mirror_malformed", "mirrored messages unusable", value=r.malformed)
        yield CounterMetricFamily(
            "kvmesh_canary_mirror_candidate_served", "mirrored requests the candidate served itself (not compared)",
            value=r.candidate_served,
        )
        yield GaugeMetricFamily(
            "kvmesh_canary_promoted_weight", "share of production traffic the candidate pool serves", value=r.promoted_weight
        )


        if self._rollout is not None:
            yield from rollout_metrics(self._rollout)


def rollout_metrics(driver: RolloutDriver) -> Iterator[Metric]:
    """The rollout's state, current step and weight, and each step's verdict and samples."""
    yield GaugeMetricFamily(
        "kvmesh_canary_rollout_state", "0 idle, 1 running, 2 completed, 3 rolled back, 4 aborted",
        value=driver.state.metric_value,
    )
    rollout = driver.rollout
    yield GaugeMetricFamily("kvmesh_canary_rollout_step", "current rollout step, from 1 (0 = none)",
                            value=rollout.index + 1 if rollout else 0)
    yield GaugeMetricFamily("kvmesh_canary_rollout_weight", "share of production traffic the rollout gives the candidate",
                            value=rollout.desired_weight if rollout else 0.0)
    verdict = GaugeMetricFamily("kvmesh_canary_rollout_step_verdict", "0 pending, 1 holding, 2 passed, 3 failed",
                                labels=["step", "weight"])
    samples = GaugeMetricFamily("kvmesh_canary_rollout_step_samples", "compared replays in the step's window",
                                labels=["step", "weight"])
    for i, step in enumerate(rollout.steps if rollout else ()):
        labels = [str(i + 1), f"{step.weight:g}"]
        verdict.add_metric(labels, step.state.metric_value)
        samples.add_metric(labels, step.samples)
    yield verdict
    yield samples


def canary_registry(report: Callable[[], Report], rollout: RolloutDriver | None = None) -> CollectorRegistry:
    """A registry of its own, so several canaries can live in one test process."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(CanaryCollector(report, rollout))
    return registry
