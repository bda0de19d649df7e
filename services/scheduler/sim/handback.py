"""What handing a finished turn's KV back to the store costs its decode worker (the simulator's
term, cluster.py; the calibration's fit of it, meshcal.py).

When a turn ends the decode worker looks its blocks up in the KV store, copies the ones the store
lacks off the engine, encodes and puts them (decode/handback.py). That is CPU work on the worker's
host after the turn, beside the next turns' prefills and steps. Measured on `kvmesh up --decode 1
--prefill 0` (tiny, CPU; bench/sim_calibration.md): a lone stream's ITL was 2.82 ms right after 16
streams of 1,024-token prompts ended, 1.12 ms on a quiet worker and 1.15 ms 0.3 s later.

    hand-back time = handback_s_per_turn + handback_s_per_token × the turn's tokens (prompt + output)

The sim holds the worker busy that long when a turn ends: its queued prefills start later and its
running streams stop. The calibration's probe sends k turns of t tokens at once, then a lone stream
right after they end and another once the worker has settled: the first's extra latency over the
second's is k × hand-back time(t).
"""

from __future__ import annotations

import numpy as np

from .meshstats import nonnegative_fit


def handback_s(tokens: float, per_turn: float, per_token: float) -> float:
    """The worker time a finished turn of `tokens` tokens costs to hand back (module docstring)."""
    return per_turn + per_token * tokens if per_turn or per_token else 0.0


def fit_handback(points: list[tuple[float, float, float]]) -> tuple[float, float]:
    """Least squares extra = turns × (per_turn + per_token × tokens) over (turns, tokens per turn,
    extra latency) points, both terms >= 0; exact for points the formula made. With one turn length
    the two cannot be told apart and the whole cost is taken per token. Returns (per_turn, per_token)."""
    if not points:
        return 0.0, 0.0
    x = np.array([[k * t, k] for k, t, _ in points], dtype=float)
    if len({t for _, t, _ in points}) <= 1:
        x = x[:, :1]
    coef = nonnegative_fit(x, np.array([e for *_, e in points], dtype=float))
    return (float(coef[1]) if len(coef) > 1 else 0.0), float(coef[0])
