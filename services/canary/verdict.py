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


@dataclass(frozen=True, slots=True)
class Check:
    """One judged figure: `value` against `limit`. `detail` says what failed (or what was seen).
    A check that is not `comparable` (e.g. latency of a candidate at idle CPU priority) never fails."""

    name: str
    value: float
    limit: float
    passed: bool
    detail: str
    comparable: bool = True

    @property
    def failed(self) -> bool:
        return self.comparable and not self.passed


def _rate_check(name: str, what: str, candidate: float, production: float, limit: float) -> Check:
    increase = candidate - production
    detail = f"{what} {candidate:.3f} vs production {production:.3f} (+{increase:.3f}"
    passed = increase <= limit
    return Check(name, increase, limit, passed, f"{detail} {'<=' if passed else '>'} {limit:g})")


def _latency_check(name: str, production_p99: float, candidate_p99: float, ratio: float, slack_s: float,
                   comparable: bool) -> Check:
    # NOTE: candidate <= ratio * production + slack, written as a delta so the figure is the p99 delta.
    limit = production_p99 * (ratio - 1.0) + slack_s
    delta = candidate_p99 - production_p99
    detail = (f"{name} p99 {candidate_p99 * 1e3:.1f} ms {'<=' if delta <= limit else '>'} "
              f"{(production_p99 + limit) * 1e3:.1f} ms ({ratio:g}x production {production_p99 * 1e3:.1f} ms)")
    if not comparable:
        detail += ": not comparable (candidate at reduced CPU priority)"
    return Check(f"{name.lower()}_p99_delta_s", delta, limit, delta <= limit, detail, comparable)


def comparison_checks(
    summary: Summary, thresholds: Thresholds, noise_floor: float | None = None, latency_comparable: bool = True
) -> list[Check]:
    """Error-rate delta, token agreement against the noise floor (the summary's own unless given),
    and the TTFT/TPOT p99 deltas. Latency checks are marked not comparable when asked to."""
    t, s = thresholds, summary
    floor = s.noise_floor_agreement if noise_floor is None else noise_floor
    agreement_floor = floor - t.max_agreement_drop
    agreed = not s.compared or s.token_agreement >= agreement_floor - 1e-12
    agreement = Check(
        "token_agreement", s.token_agreement, agreement_floor, agreed,
        f"token agreement {s.token_agreement:.3f} {'>=' if agreed else '<'} {agreement_floor:.3f} "
        f"(noise floor {floor:.3f} - {t.max_agreement_drop:g})",
    )
    return [
        _rate_check("error_rate_delta", "error rate", s.candidate_error_rate, s.production_error_rate,
                    t.max_error_rate_increase),
        agreement,
        _latency_check("TTFT", s.ttft.production.p99, s.ttft.candidate.p99, t.max_ttft_p99_regression,
                       t.latency_slack_s, latency_comparable),
        _latency_check("TPOT", s.tpot.production.p99, s.tpot.candidate.p99, t.max_tpot_p99_regression,
                       t.latency_slack_s, latency_comparable),
    ]


def served_5xx_check(candidate_rate: float, production_rate: float, thresholds: Thresholds) -> Check:
    """The candidate's own 5xx rate on the production requests it served, against production's."""
    return _rate_check("candidate_5xx_delta", "candidate 5xx rate", candidate_rate, production_rate,
                       thresholds.max_error_rate_increase)


def decide(summary: Summary, thresholds: Thresholds) -> Decision:
    """COLLECTING below `min_samples`; then FAIL on any breached threshold (all are named), else PASS."""
    t = thresholds
    if summary.samples < t.min_samples:
        return Decision(Verdict.COLLECTING, f"{summary.samples}/{t.min_samples} samples")
    failures = [check.detail for check in comparison_checks(summary, t) if check.failed]
    if failures:
        return Decision(Verdict.FAIL, "; ".join(failures))
    return Decision(
        Verdict.PASS,
        f"{summary.samples} samples: token agreement {summary.token_agreement:.3f} "
        f"(noise floor {summary.noise_floor_agreement:.3f}), exact match {summary.exact_match_rate:.3f}, "
        f"error rate {summary.candidate_error_rate:.3f} vs {summary.production_error_rate:.3f}",
    )
