"""Statistics over the calibration probes' repeats (meshstats.py): the constrained fit every term
uses, each point's median, and which points the spread check sends back to be probed again."""

import numpy as np
import pytest

from kvmesh.scheduler.sim.meshcal import fit_prefill
from kvmesh.scheduler.sim.meshstats import medians, nonnegative_fit, relative_spread, unsettled


def test_the_free_fit_is_kept_when_every_constrained_coefficient_is_nonnegative():
    n = np.array([64.0, 256.0, 512.0, 1024.0, 1536.0])
    x = np.column_stack([np.ones_like(n), n, n * n / 2])
    y = 0.012 + 3e-6 * n + 5e-8 * n * n / 2
    assert nonnegative_fit(x, y, free=1) == pytest.approx([0.012, 3e-6, 5e-8], rel=1e-9)


def test_a_negative_coefficient_is_dropped_and_the_rest_refitted_while_the_intercept_may_go_negative():
    n = np.array([64.0, 256.0, 512.0, 1024.0, 1536.0])
    x = np.column_stack([np.ones_like(n), n, n * n / 2])
    y = -0.004 + 5e-8 * n * n / 2 - 1e-6 * n  # the free fit's linear term is negative
    coef = nonnegative_fit(x, y, free=1)
    assert coef[1] == 0.0 and coef[2] > 0
    only_attention = np.linalg.lstsq(x[:, [0, 2]], y, rcond=None)[0]
    assert coef[[0, 2]] == pytest.approx(only_attention, rel=1e-12)
    assert coef[0] < 0  # free: not clamped


def test_with_two_lengths_the_prefill_fit_is_a_straight_line_and_without_points_all_zero():
    assert fit_prefill([(64, 0.010), (1536, 0.070)]) == pytest.approx((0.010 - 64 * 0.06 / 1472, 0.06 / 1472, 0.0))
    assert nonnegative_fit(np.zeros((0, 2)), np.zeros(0)).tolist() == [0.0, 0.0]
    assert nonnegative_fit(np.array([[1.0], [2.0]]), np.array([-1.0, -2.0])).tolist() == [0.0]


def test_medians_take_each_points_repeats_in_key_order():
    points = [(256, 0.02), (64, 0.011), (64, 0.030), (256, 0.018), (64, 0.010)]
    assert medians(points) == [(64, 0.011), (256, 0.019)]
    assert medians([(8, 1568.0, 3e-3), (8, 1568.0, 9e-3), (8, 1568.0, 4e-3)]) == [(8, 1568.0, 4e-3)]


def test_a_point_is_unsettled_when_half_its_interquartile_range_exceeds_the_limit_of_its_median():
    assert relative_spread([10, 10, 10, 30, 30]) == pytest.approx(10 / 10)   # two of five in a burst
    assert relative_spread([10, 10.5, 10, 9.5, 30]) == pytest.approx(0.25 / 10)  # one outlier: the median holds
    assert relative_spread([10, 30]) == 0.0                                  # too few to tell
    repeats = {"64": [10, 10, 10, 30, 30], "1536": [70, 71, 69, 70, 90], "512": [20, 20, 26, 26, 20]}
    assert unsettled(repeats, 0.15) == ["64"]
    assert unsettled(repeats, 0.1) == ["64", "512"]  # worst first
