"""The verdict: thresholds over a comparison summary → collecting, pass or fail, with a reason."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from .compare import Summary


class Verdict(enum.IntEnum):
    """Values match kvmesh.v1.Verdict."""

    COLLECTING = 1
    PASS = 2
    FAIL = 3

    @property
    def metric_value(self) -> int:
        """The `kvmesh_canary_verdict` gauge: 0 collecting, 1 pass, 2 fail."""
        return self.value - 1


@dataclass(frozen=True, slots=True)
class Thresholds:
    min_samples: int = 20
    # The candidate's token agreement may sit at most this far below the noise floor.
    max_agreement_drop: float = 0.02
    # Candidate error rate minus production error rate.
    max_error_rate_increase: float = 0.01
    # Candidate p99 may be at most `ratio * production p99 + latency_slack_s`.
    max_ttft_p99_regression: float = 1.5
    max_tpot_p99_regression: float = 1.5
    latency_slack_s: float = 0.005

    def __post_init__(self) -> None:
        if self.min_samples < 1:
            raise ValueError("min_samples must be at least 1")
        if self.max_ttft_p99_regression <= 0 or self.max_tpot_p99_regression <= 0:
            raise ValueError("latency regression ratios must be positive")


@dataclass(frozen=True, slots=True)
class Decision:
    verdict: Verdict
    reason: str


def _latency_failure(name: str, production_p99: float, candidate_p99: float, ratio: float, slack_s: float) -> str | None:
    limit = production_p99 * ratio + slack_s
    if candidate_p99 <= limit:
        return None
    return f"{name} p99 {candidate_p99 * 1e3:.1f} ms > {limit * 1e3:.1f} ms ({ratio:g}x production {production_p99 * 1e3:.1f} ms)"


def decide(summary: Summary, thresholds: Thresholds) -> Decision:
    """COLLECTING below `min_samples`; then FAIL on any breached threshold (all are named), else PASS."""
    t = thresholds
    if summary.samples < t.min_samples:
        return Decision(Verdict.COLLECTING, f"{summary.samples}/{t.min_samples} samples")
    failures: list[str] = []
    error_increase = summary.candidate_error_rate - summary.production_error_rate
    if error_increase > t.max_error_rate_increase:
        failures.append(
            f"error rate {summary.candidate_error_rate:.3f} vs production {summary.production_error_rate:.3f} "
            f"(+{error_increase:.3f} > {t.max_error_rate_increase:g})"
        )
    agreement_floor = summary.noise_floor_agreement - t.max_agreement_drop
    if summary.compared and summary.token_agreement < agreement_floor - 1e-12:
        failures.append(
            f"token agreement {summary.token_agreement:.3f} < {agreement_floor:.3f} "
            f"(noise floor {summary.noise_floor_agreement:.3f} - {t.max_agreement_drop:g})"
        )
    for name, delta, ratio in (
        ("TTFT", summary.ttft, t.max_ttft_p99_regression),
        ("TPOT", summary.tpot, t.max_tpot_p99_regression),
    ):
        failure = _latency_failure(name, delta.production.p99, delta.candidate.p99, ratio, t.latency_slack_s)
        if failure:
            failures.append(failure)
    if failures:
        return Decision(Verdict.FAIL, "; ".join(failures))
    return Decision(
        Verdict.PASS,
        f"{summary.samples} samples: token agreement {summary.token_agreement:.3f} "
        f"(noise floor {summary.noise_floor_agreement:.3f}), exact match {summary.exact_match_rate:.3f}, "
        f"error rate {summary.candidate_error_rate:.3f} vs {summary.production_error_rate:.3f}",
    )
