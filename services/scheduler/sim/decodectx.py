"""What a decode step's context costs: a line in the batch's padded KV tokens that steepens past a
knee (the simulator's step cost, cluster.py, and the calibration's fit of it, meshcal.py).

Measured on `kvmesh up --decode 1 --prefill 0` (tiny, CPU; bench/sim_calibration.md): the decode
ITL of k streams with p-token prompts is flat until k × p reaches ~5-6k tokens whatever k is
(4 streams of 1,536 tokens cost what 4 of 32 do; 24 of 256 already cost more), then grows by
~5e-7 s per token of k × p. And one 1,536-token stream among fifteen 32-token ones makes the step
cost what sixteen 1,536-token streams do. The engine's reference attention gathers every row's
context padded to the longest one (engine/attention.py), so the work is running × longest context,
not the sum of the contexts and not each stream's own; the knee is where that gathered K/V (128
bytes per token per layer on tiny, for K and for V) outgrows the core's 1 MiB L2. A line in each
stream's context, fitted at 1,568 tokens through 64, priced the trace's ~1k-token contexts as if the
gather never fitted in cache. Below the knee it is not free, though (run AF, 2026-12-02: 1.9 ms
more at 4 × 1,056 tokens, 2.75 at 8 × 800, ~0.45 µs per padded token), and the trace's steps are
there (3-4 rows of ~1.25k tokens); a hinge that priced them at 0 and every row past ~5k at the
steep slope let the simulator's batch run away at 80% load.

Most of the steepness measured until 2026-12-03 was not the cache but the allocator: workers fixed
glibc's mmap threshold, which also pinned its trim threshold at 128 KiB, so each step's freed
gather buffers went back to the OS and the next step faulted them in again (runtime/heap.py). With
the trim threshold fixed too, 16 × 1,568 streamed at 4.8 ms a token instead of 12.5 and 24 × 1,568
at 6.4-6.9 instead of 18.3 (1 worker, the same host); a smaller knee remains (run BD, on a faster
host: 2.0e-7 s per padded token past ~10k, against 6.2e-7 past ~8k in run BC), and the calibration
fits whatever the mesh shows.

    extra step time = per_token × padded + slope × max(0, padded − knee),   padded = running × longest context
"""

from __future__ import annotations

import numpy as np


def padded_tokens(contexts: list[float]) -> float:
    """The KV tokens a decode step's attention reads: every running row padded to the longest."""
    return len(contexts) * max(contexts, default=0.0)


def hinge_s(padded: float, slope: float, knee: float, per_token: float = 0.0) -> float:
    """The decode step's extra time for `padded` KV tokens (see the module docstring)."""
    return per_token * padded + slope * max(0.0, padded - knee)


def fit_hinge(points: list[tuple[float, float]], weights: list[float] | None = None) -> tuple[float, float, float]:
    """Least squares (every term >= 0) of extra = per_token × padded + slope × max(0, padded − knee)
    over (padded tokens, extra step time) points; returns (per_token, slope, knee). Exact for points
    the model made, given a point below the knee (else per_token is 0) and two past it: each split of
    the points into those below and those past the knee fits a line through the origin to the former
    and a line to the latter, which meet at the knee; where they meet outside the split's neighbours
    (or the slopes come out negative), the knee is held at the nearer neighbour and the two slopes
    refitted. With fewer than two distinct points past any split, the knee is 0 (a line through the
    origin: the old per-token model). `weights` (one per point) weigh each point's residual: the
    calibration passes 1 / its step time, so that a point's error counts relative to its step (see
    meshcal._fit_context)."""
    order = sorted(range(len(points)), key=lambda i: (float(points[i][0]), float(points[i][1])))
    pts = [(float(points[i][0]), float(points[i][1])) for i in order]
    w = np.array([1.0 if weights is None else float(weights[i]) for i in order])
    best = (float(np.sum((w * np.array([e for _, e in pts])) ** 2)), 0.0, 0.0, 0.0)  # (residual, per_token, slope, knee): none
    for m in range(len(pts)):
        below, past = pts[:m], pts[m:]
        if len({t for t, _ in past}) < 2:
            continue
        low, high = (pts[m - 1][0] if m else 0.0), past[0][0]
        per_token = max(0.0, _line_through_origin(below, w[:m]))  # NOTE: a true 0 can come out -1e-20
        t, e = np.array([p[0] for p in past]), np.array([p[1] for p in past])
        rise, intercept = np.polyfit(t, e, 1, w=w[m:])
        slope = rise - per_token
        knee = -intercept / slope if slope > 0 else low
        candidates = [_fixed_knee(pts, knee, w)] if low <= knee <= high and per_token >= 0 and slope >= 0 else []
        candidates += [_fixed_knee(pts, low, w), _fixed_knee(pts, high, w)]
        for candidate in candidates:
            if candidate[0] < best[0] - 1e-24 * max(1.0, best[0]):
                best = candidate
    if best[1:] == (0.0, 0.0, 0.0) and pts:
        best = min(best, _fixed_knee(pts, 0.0, w))
    return best[1], best[2], best[3]


def _line_through_origin(pts: list[tuple[float, float]], w: np.ndarray) -> float:
    x, y = np.array([t for t, _ in pts]) * w, np.array([e for _, e in pts]) * w
    return float(x @ y / (x @ x)) if len(pts) and x @ x > 0 else 0.0


def _fixed_knee(pts: list[tuple[float, float]], knee: float, w: np.ndarray) -> tuple[float, float, float, float]:
    """(residual, per_token, slope, knee) of the (weighted) least squares, both slopes >= 0, knee fixed."""
    y = np.array([e for _, e in pts]) * w
    cols = np.array([[t, max(0.0, t - knee)] for t, _ in pts]) * w[:, None]
    best = (float(y @ y), 0.0, 0.0, knee)
    for use in ((0, 1), (0,), (1,)):
        x = cols[:, use]
        if np.linalg.matrix_rank(x) < len(use):
            continue
        coef = np.linalg.lstsq(x, y, rcond=None)[0]
        if np.any(coef < 0):
            continue
        full = [0.0, 0.0]
        for j, c in zip(use, coef):
            full[j] = float(c)
        residual = float(np.sum((x @ coef - y) ** 2))
        if residual < best[0] - 1e-24 * max(1.0, best[0]):
            best = (residual, full[0], full[1] if 1 in use else 0.0, knee)
    return best
