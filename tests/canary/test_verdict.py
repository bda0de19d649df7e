"""Thresholds over a summary → collecting, pass or fail with a reason."""

import pytest

from kvmesh.canary.compare import Comparison, Outcome
from kvmesh.canary.verdict import Thresholds, Verdict, decide

T = Thresholds(
    min_samples=4,
    max_agreement_drop=0.05,
    max_error_rate_increase=0.1,
    max_ttft_p99_regression=1.5,
    max_tpot_p99_regression=1.5,
    latency_slack_s=0.0,
)


def summary(pairs, noise=()):
    c = Comparison()
    for production, candidate in pairs:
        c.add_candidate(production, candidate)
    for production, replay in noise:
        c.add_noise(production, replay)
    return c.summary()


def ok(tokens, ttft=0.1, tpot=0.01):
    return Outcome(tuple(tokens), ttft, tpot)


def test_collecting_below_min_samples():
    d = decide(summary([(ok([1, 2]), ok([1, 2]))] * 3), T)
    assert (d.verdict, d.reason) == (Verdict.COLLECTING, "3/4 samples")


def test_identical_candidate_passes():
    d = decide(summary([(ok([1, 2]), ok([1, 2]))] * 4), T)
    assert d.verdict is Verdict.PASS
    assert d.reason.startswith("4 samples: token agreement 1.000")


def test_low_agreement_fails():
    d = decide(summary([(ok([1, 2]), ok([1, 9]))] * 4), T)
    assert d.verdict is Verdict.FAIL
    assert d.reason == "token agreement 0.500 < 0.950 (noise floor 1.000 - 0.05)"


def test_agreement_at_the_noise_floor_passes():
    # Production disagrees with itself as much as the candidate does: not the candidate's fault.
    noisy = [(ok([1, 2]), ok([1, 9]))] * 4
    d = decide(summary(noisy, noise=noisy), T)
    assert d.verdict is Verdict.PASS


def test_error_rate_increase_fails():
    err = Outcome((), 0.0, 0.0, "generate: INTERNAL")
    d = decide(summary([(ok([1, 2]), ok([1, 2]))] * 3 + [(ok([1, 2]), err)]), T)
    assert d.verdict is Verdict.FAIL
    assert d.reason == "error rate 0.250 vs production 0.000 (+0.250 > 0.1)"


def test_ttft_regression_fails():
    d = decide(summary([(ok([1, 2], ttft=0.1), ok([1, 2], ttft=1.0))] * 4), T)
    assert d.verdict is Verdict.FAIL
    assert d.reason == "TTFT p99 1000.0 ms > 150.0 ms (1.5x production 100.0 ms)"


def test_every_breach_is_named():
    d = decide(summary([(ok([1, 2], ttft=0.1, tpot=0.01), ok([3, 4], ttft=1.0, tpot=0.1))] * 4), T)
    assert d.verdict is Verdict.FAIL
    assert [part.split(" ")[0] for part in d.reason.split("; ")] == ["token", "TTFT", "TPOT"]


def test_latency_slack_absorbs_tiny_regressions():
    tiny = [(ok([1, 2], ttft=0.001), ok([1, 2], ttft=0.003))] * 4
    assert decide(summary(tiny), T).verdict is Verdict.FAIL
    slack = Thresholds(min_samples=4, latency_slack_s=0.005)
    assert decide(summary(tiny), slack).verdict is Verdict.PASS


def test_metric_values():
    assert [v.metric_value for v in (Verdict.COLLECTING, Verdict.PASS, Verdict.FAIL)] == [0, 1, 2]


def test_thresholds_reject_nonsense():
    with pytest.raises(ValueError):
        Thresholds(min_samples=0)
