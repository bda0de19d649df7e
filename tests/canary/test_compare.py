"""Per-pair token comparison and the aggregate over many pairs."""

import pytest

from kvmesh.canary.compare import Comparison, Outcome, match_tokens, percentile


def test_identical_sequences():
    m = match_tokens([1, 2, 3], [1, 2, 3])
    assert (m.exact, m.first_divergence, m.agreement) == (True, None, 1.0)


def test_two_empty_sequences_agree():
    assert match_tokens([], []).agreement == 1.0


def test_divergence_in_the_middle():
    m = match_tokens([1, 2, 3, 4], [1, 2, 9, 4])
    assert (m.exact, m.first_divergence, m.agreement) == (False, 2, 0.75)


def test_shorter_output_diverges_where_it_ends():
    m = match_tokens([1, 2, 3, 4], [1, 2])
    assert (m.exact, m.first_divergence, m.agreement) == (False, 2, 0.5)


def test_longer_output_counts_against_the_longer_length():
    m = match_tokens([5], [5, 6, 7, 8, 9])
    assert (m.first_divergence, m.agreement) == (1, 0.2)


def test_completely_different():
    m = match_tokens([1, 2], [3, 4])
    assert (m.first_divergence, m.agreement) == (0, 0.0)


def test_percentile_interpolates_between_ranks():
    values = [1.0, 2.0, 3.0, 4.0]
    assert percentile(values, 50) == 2.5
    assert percentile(values, 99) == pytest.approx(3.97)
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) == 0.0


def ok(tokens, ttft=0.1, tpot=0.01):
    return Outcome(tuple(tokens), ttft, tpot)


def test_aggregate_rates_over_pairs():
    c = Comparison()
    c.add_candidate(ok([1, 2, 3, 4]), ok([1, 2, 3, 4]))
    c.add_candidate(ok([1, 2, 3, 4]), ok([1, 2, 0, 0]))
    s = c.summary()
    assert (s.samples, s.compared) == (2, 2)
    assert s.exact_match_rate == 0.5
    assert s.token_agreement == 0.75
    assert s.mean_first_divergence == 2.0


def test_mean_first_divergence_is_minus_one_when_nothing_differs():
    c = Comparison()
    c.add_candidate(ok([1]), ok([1]))
    assert c.summary().mean_first_divergence == -1.0


def test_errors_count_in_rates_but_not_in_token_agreement():
    c = Comparison()
    c.add_candidate(ok([1, 2]), ok([1, 2]))
    c.add_candidate(ok([1, 2]), Outcome((), 0.0, 0.0, "generate: UNAVAILABLE"))
    c.add_candidate(Outcome((), 0.0, 0.0, "production failed"), ok([3, 4]))
    c.add_candidate(ok([1, 2]), ok([1, 2]))
    s = c.summary()
    assert (s.samples, s.compared) == (4, 2)
    assert (s.production_error_rate, s.candidate_error_rate) == (0.25, 0.25)
    assert s.token_agreement == 1.0


def test_latency_quantiles_of_both_sides():
    c = Comparison()
    for i in range(1, 5):
        c.add_candidate(ok([1, 2], ttft=0.1 * i, tpot=0.01), ok([1, 2], ttft=1.0 * i, tpot=0.1))
    s = c.summary()
    assert s.ttft.production.p50 == pytest.approx(0.25)
    assert s.ttft.candidate.p50 == pytest.approx(2.5)
    assert s.ttft.delta_p50 == pytest.approx(2.25)
    assert s.tpot.delta_p99 == pytest.approx(0.09)


def test_single_token_outputs_have_no_tpot():
    c = Comparison()
    c.add_candidate(ok([1], tpot=0.0), ok([1], tpot=0.0))
    c.add_candidate(ok([1, 2], tpot=0.02), ok([1, 2], tpot=0.04))
    assert c.summary().tpot.production.p50 == 0.02


def test_noise_floor_is_one_until_measured():
    c = Comparison()
    assert (c.summary().noise_floor_agreement, c.summary().noise_samples) == (1.0, 0)
    c.add_noise(ok([1, 2, 3, 4]), ok([1, 2, 3, 5]))
    c.add_noise(ok([1, 2]), ok([1, 2]))
    assert (c.summary().noise_floor_agreement, c.summary().noise_samples) == (0.875, 2)


def test_failed_noise_replays_are_ignored():
    c = Comparison()
    c.add_noise(ok([1]), Outcome((), 0.0, 0.0, "boom"))
    assert c.summary().noise_samples == 0
