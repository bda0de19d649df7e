"""What a decode step's context costs: a hinge in the batch's padded KV tokens (the simulator's
step cost, cluster.py, and the calibration's fit of it, meshcal.py).

Measured on `kvmesh up --decode 1 --prefill 0` (tiny, CPU; bench/sim_calibration.md): the decode
ITL of k streams with p-token prompts is flat until k × p reaches ~5-6k tokens whatever k is
(4 streams of 1,536 tokens cost what 4 of 32 do; 24 of 256 already cost more), then grows by
~5e-7 s per token of k × p. And one 1,536-token stream among fifteen 32-token ones makes the step
cost what sixteen 1,536-token streams do. The engine's reference attention gathers every row's
context padded to the longest one (engine/attention.py), so the work is running × longest context,
not the sum of the contexts and not each stream's own; the knee is where that gathered K/V (128
bytes per token per layer on tiny, for K and for V) outgrows the core's 1 MiB L2. A line in each
stream's context, fitted at 1,568 tokens through 64, priced the trace's ~1k-token contexts as if the
gather never fitted in cache.

    extra step time = slope × max(0, padded − knee),   padded = running × longest context
"""

from __future__ import annotations

import numpy as np


def padded_tokens(contexts: list[float]) -> float:
    """The KV tokens a decode step's attention reads: every running row padded to the longest."""
    return len(contexts) * max(contexts, default=0.0)


def hinge_s(padded: float, slope: float, knee: float) -> float:
    """The decode step's extra time for `padded` KV tokens (see the module docstring)."""
    return slope * max(0.0, padded - knee)


def fit_hinge(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least squares (slope >= 0, knee >= 0) of extra = slope × max(0, padded − knee) over (padded
    tokens, extra step time) points; returns (slope, knee). Exact for points the hinge made, given
    two of them past the knee: each split of the points into those below and those past the knee
    fits a line to the latter, its knee (where it crosses 0) held between the split's neighbours;
    with one point past the knee, or fewer than two distinct ones, the knee is 0 (a line through
    the origin: the old per-token model)."""
    pts = sorted((float(t), float(e)) for t, e in points)
    best = (sum(e * e for _, e in pts), 0.0, 0.0)  # (residual, slope, knee): no context cost
    if len({t for t, _ in pts}) < 2:
        return _through_origin(pts, 0.0)[1:] if pts else (0.0, 0.0)
    for m in range(len(pts) - 1):
        past = pts[m:]
        low = pts[m - 1][0] if m else 0.0
        high = past[0][0]
        if len({t for t, _ in past}) < 2:
            continue
        t, e = np.array([p[0] for p in past]), np.array([p[1] for p in past])
        slope, intercept = np.polyfit(t, e, 1)
        if slope <= 0:
            continue
        knee = min(high, max(low, -intercept / slope))
        candidate = _through_origin(past, knee)
        residual = candidate[0] + sum(e * e for _, e in pts[:m])
        if residual < best[0] - 1e-24 * max(1.0, best[0]):
            best = (residual, candidate[1], knee)
    return best[1], best[2]


def _through_origin(pts: list[tuple[float, float]], knee: float) -> tuple[float, float, float]:
    """(residual, slope, knee) of extra = slope × max(0, padded − knee), slope >= 0, knee fixed."""
    x = np.array([max(0.0, t - knee) for t, _ in pts])
    y = np.array([e for _, e in pts])
    slope = max(0.0, float(x @ y / (x @ x))) if x @ x > 0 else 0.0
    return float(np.sum((slope * x - y) ** 2)), slope, knee
