"""Statistics over the calibration probes' repeats (meshprobe.py measures, meshcal.py fits):
the small constrained least squares every term's fit uses, the median of each probe point's
repeats, the spread check that sends a point whose repeats disagree back to be probed again, and
the host's noise as deciles of the lone TTFTs around their medians.

Every probe point (a prompt length, a stream count, ...) is measured `repeats` times, the points
taking turns, so a burst of the host's noise lands on a few repeats of several points rather than
on every repeat of one; the fit takes each point's median.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Hashable, Iterable

import numpy as np


def nonnegative_fit(x: np.ndarray, y: np.ndarray, free: int = 0) -> np.ndarray:
    """Least squares y = x @ coef with coef >= 0 except the first `free` columns (an intercept).
    Exact for the few columns used here: the best of the least-squares fits over every subset of
    the constrained columns (the others 0) whose coefficients come out >= 0, larger subsets and
    earlier columns first on a tie; a subset whose columns the points cannot tell apart (fewer
    distinct rows than columns) is skipped."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if not len(y):
        return np.zeros(x.shape[-1])
    best: tuple[float, np.ndarray] | None = None
    tie = 1e-24 * float(y @ y)  # residuals closer than this are equal (exact fits differ by rounding only)
    constrained = range(free, x.shape[1])
    for size in range(len(constrained), -1, -1):
        for used in itertools.combinations(constrained, size):
            columns = [*range(free), *used]
            coef = np.zeros(x.shape[1])
            if columns:
                a = x[:, columns]
                if np.linalg.matrix_rank(a) < len(columns):
                    continue
                coef[columns] = np.linalg.lstsq(a, y, rcond=None)[0]
                if (coef[list(used)] < 0).any():
                    continue
            residual = float(np.sum((x @ coef - y) ** 2))
            if best is None or residual < best[0] - tie:
                best = (residual, coef)
    return np.zeros(x.shape[1]) if best is None else best[1]


def medians(points: Iterable[tuple]) -> list[tuple]:
    """(key..., value) repeats -> one (key..., median value) per key, in key order."""
    groups: dict[tuple, list[float]] = {}
    for *key, value in points:
        groups.setdefault(tuple(key), []).append(value)
    return [(*key, statistics.median(values)) for key, values in sorted(groups.items())]


def relative_spread(values: list[float]) -> float:
    """Half the interquartile range over the median (0 for fewer than 3 values, or a median <= 0)."""
    if len(values) < 3:
        return 0.0
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return (q3 - q1) / 2 / median if median > 0 else 0.0


def unsettled(repeats: dict[Hashable, list[float]], limit: float) -> list[Hashable]:
    """The probe points whose repeats disagree (relative_spread > limit), worst first: those to probe again."""
    spread = {key: relative_spread(values) for key, values in repeats.items()}
    return sorted((key for key, s in spread.items() if s > limit), key=lambda key: -spread[key])


def noise_quantiles(ratios: list[float], count: int = 10) -> tuple[float, ...]:
    """The `count` quantiles of `ratios` at (i + 0.5) / count (deciles by default: each stands for a
    tenth of the requests, so one outlier among the probes is not given to a tenth of them),
    interpolated, scaled so the median is 1."""
    if not ratios:
        return ()
    ordered = sorted(ratios)

    def at(q: float) -> float:
        pos = q * (len(ordered) - 1)
        low = int(pos)
        high = min(low + 1, len(ordered) - 1)
        return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)

    middle = statistics.median(ordered)
    return tuple(float(at((i + 0.5) / count) / middle) for i in range(count)) if middle > 0 else ()


def around_median(points: list[tuple[Hashable, float]]) -> list[float]:
    """Each (key, value) point's value over the median of those with its key."""
    by_key: dict[float, list[float]] = {}
    for key, value in points:
        by_key.setdefault(key, []).append(value)
    middle = {key: statistics.median(values) for key, values in by_key.items()}
    return [value / middle[key] for key, value in points if middle[key] > 0]
